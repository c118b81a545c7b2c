"""The reference article's vLLM failures, as vLLM and its build tools print them, each to its fix."""

from __future__ import annotations

import pytest

from reconcile.vllm.failures import diagnose, removed_flag_fix
from reconcile.vllm.toolchain import compute_arch, cuda_suffix, header_package, min_cuda_for

ARGPARSE = (
    "usage: vllm serve [model_tag] [options]\n"
    "vllm serve: error: unrecognized arguments: --rope-scaling "
    '{"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":262144} --swap-space 16'
)
MAX_LEN = (
    "(APIServer pid=48211) ERROR 11-30 17:45:12 [api_server.py:1892]   Value error, "
    "User-specified max_model_len "
    "(1056768) is greater than the derived max_model_len (max_position_embeddings=1048576.0 or "
    "model_max_length=None in model's config.json). To allow overriding this maximum, set the env var "
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. [type=value_error, input_value=ArgsKwargs((), {'model': ...}), "
    "input_type=ArgsKwargs]"
)
NVCC_MISSING = (
    "(Worker_TP0 pid=48390) RuntimeError: Could not find nvcc and default "
    "cuda_home='/usr/local/cuda' doesn't exist"
)
NVCC_OLD = (
    "(EngineCore_DP0 pid=48302) RuntimeError: Failed to get device capability: SM 12.x requires CUDA >= 12.9"
)
ARCH = "(EngineCore_DP0 pid=48302) RuntimeError: FlashInfer requires GPUs with sm75 or higher"
NINJA = "(Worker_TP1 pid=48391) RuntimeError: 'ninja' not found. Install it with `pip install ninja`."
CURAND = (
    "/root/.cache/flashinfer/0.6.14/120f/generated/sampling.cu:18:10: fatal error: curand_kernel.h: "
    "No such file or directory"
)
FREE = (
    "(EngineCore_DP0 pid=48302) ValueError: Free memory on device cuda:1 (19.67/31.36 GiB) on startup "
    "is less "
    "than desired GPU memory utilization (0.9, 28.22 GiB). Decrease GPU memory utilization or reduce GPU "
    "memory used by other processes."
)
KV = (
    "(EngineCore_DP0 pid=1) ValueError: To serve at least one request with the model's max seq len "
    "(1048576), "
    "7.89 GiB KV cache is needed, which is larger than the available KV cache memory (4.0 GiB). Based on the "
    "available memory, the estimated maximum model length is 530432. Try increasing `gpu_memory_utilization` "
    "or decreasing `max_model_len` when initializing the engine."
)
REASONING = (
    "(APIServer pid=48211) KeyError: 'invalid reasoning parser: nano_v3 (chose from { deepseek_r1,glm45,"
    "granite,hunyuan_a13b,mistral,qwen3,step3 })'"
)


def one(line: str, cuda_version: str | None = None) -> tuple[str, str, str]:
    found = diagnose(line.splitlines(), cuda_version=cuda_version)
    assert len(found) == 1, found
    return found[0].failure_id, found[0].explanation, found[0].fix


def test_removed_flags_get_their_replacements() -> None:
    rule, explanation, fix = one(ARGPARSE)
    assert rule == "flags.removed"
    assert "--rope-scaling" in explanation and "--swap-space" in explanation
    assert "rope_parameters" in fix and "drop args.swap-space" in fix


def test_rope_scaling_value_becomes_the_config_json_patch() -> None:
    fix = removed_flag_fix(
        "--rope-scaling", '{"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 262144}'
    )
    assert (
        'rope_parameters = { factor = 4.0, original_max_position_embeddings = 262144, rope_type = "yarn" }'
        in fix
    )
    assert "rope_theta = 1000000.0" in removed_flag_fix("rope-theta", 1000000.0)


def test_max_model_len_above_derived_says_the_exact_value() -> None:
    rule, explanation, fix = one(MAX_LEN)
    assert rule == "max-model-len.derived"
    assert "1,056,768" in explanation and "1,048,576" in explanation
    assert "max-model-len = 1048576 exactly" in fix and "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in fix


def test_missing_nvcc_names_the_package_for_the_toolkit() -> None:
    assert one(NVCC_MISSING, "13.0")[0] == "toolchain.nvcc"
    assert "cuda-nvcc-13-0" in one(NVCC_MISSING, "13.0")[2]
    assert "cuda-nvcc-12-9" in one("bash: nvcc: command not found", "12.9")[2]


def test_old_nvcc_on_blackwell_points_at_cuda_13() -> None:
    rule, explanation, fix = one(NVCC_OLD)
    assert rule == "toolchain.nvcc" and "12.9" in explanation and "cuda-13.0" in fix


def test_sm75_message_is_explained_as_an_empty_arch_list() -> None:
    rule, explanation, _fix = one(ARCH)
    assert rule == "toolchain.arch" and "misleading" in explanation and "--list-gpu-arch" in explanation


@pytest.mark.parametrize(
    "line",
    [NINJA, "RuntimeError: Ninja is required to load C++ extensions",
     "FileNotFoundError: [Errno 2] No such file or directory: 'ninja'"],
)  # fmt: skip
def test_missing_ninja_goes_into_the_venv(line: str) -> None:
    rule, _explanation, fix = one(line)
    assert rule == "toolchain.ninja" and 'ninja = "*"' in fix


@pytest.mark.parametrize(
    ("header", "package"),
    [
        ("curand_kernel.h", "libcurand-dev-13-0"),
        ("cublasLt.h", "libcublas-dev-13-0"),
        ("nvrtc.h", "cuda-nvrtc-dev-13-0"),
        ("cusparse.h", "libcusparse-dev-13-0"),
        ("cuda_runtime.h", "cuda-cudart-dev-13-0"),
        ("cudnn.h", "libcudnn9-dev-cuda-13"),
    ],
)
def test_missing_header_names_its_apt_package(header: str, package: str) -> None:
    line = f"/tmp/build/gemm.cu:3:10: fatal error: {header}: No such file or directory"
    rule, _explanation, fix = one(line, "13.0")
    assert rule == "toolchain.headers" and package in fix


def test_header_package_suffix_follows_the_toolkit_version() -> None:
    assert header_package("curand_kernel.h", "/usr/local/cuda-12.8") == "libcurand-dev-12-8"
    assert header_package("cublasLt.h", "13.0.88") == "libcublas-dev-13-0"
    assert header_package("curand_kernel.h", None) == "libcurand-dev-X-Y"
    assert header_package("my_own.h", "13.0") is None
    assert "X-Y is the toolkit's version" in one(CURAND)[2]
    assert cuda_suffix("Cuda compilation tools, release 13.0, V13.0.88") == "13-0"


def test_free_memory_at_startup_points_at_stray_workers() -> None:
    rule, explanation, fix = one(FREE)
    assert rule == "host.gpu-free"
    assert "11.69 GiB of cuda:1" in explanation
    assert "nvidia-smi --query-compute-apps" in fix and "0.61" in fix


def test_kv_cache_too_small_uses_vllms_own_estimate() -> None:
    rule, explanation, fix = one(KV)
    assert rule == "memory.fit" and "7.89 GiB" in explanation and "<= 530432" in fix
    older = (
        "ValueError: To serve at least one request with the models's max seq len (262144), (24.0 GiB KV "
        "cache is needed, which is larger than the available KV cache memory (9.05 GiB)."
    )
    assert one(older)[0] == "memory.fit"


def test_unregistered_reasoning_parser_points_at_the_plugin_file() -> None:
    rule, _explanation, fix = one(REASONING)
    assert rule == "model.plugin" and "<model dir>/nano_v3_reasoning_parser.py" in fix


def test_plugin_that_fails_to_import_is_reported() -> None:
    line = (
        "(APIServer pid=7) ERROR Failed to load module 'nano_v3_reasoning_parser' from "
        "/root/models/x/nano_v3_reasoning_parser.py."
    )
    assert one(line)[0] == "model.plugin"


def test_unknown_tool_parser_and_busy_port() -> None:
    assert (
        one("KeyError: 'invalid tool call parser: hermez (chose from { hermes,llama3_json })'")[0]
        == "model.parsers"
    )
    assert (
        one(
            "OSError: [Errno 98] error while attempting to bind on address ('0.0.0.0', 20000): "
            "address already in use"
        )[0]
        == "host.port"
    )


def test_a_traceback_repeating_the_error_is_diagnosed_once() -> None:
    log = [
        "INFO 11-30 17:40:01 [api_server.py:1351] vLLM API server version 0.26.0rc1",
        FREE,
        FREE,
        "Traceback",
        FREE,
    ]
    assert len(diagnose(log)) == 1


def test_a_healthy_log_has_no_diagnosis() -> None:
    log = [
        "INFO 11-30 17:40:01 [api_server.py:1351] vLLM API server version 0.26.0rc1",
        "(EngineCore_DP0 pid=48302) INFO [kv_cache_utils.py:1087] GPU KV cache size: 12,293,168 tokens",
        "INFO:     Application startup complete.",
    ]
    assert diagnose(log) == []


def test_archs_and_their_minimum_cuda() -> None:
    assert compute_arch("12.0") == "compute_120" and compute_arch("9.0") == "compute_90"
    assert min_cuda_for("12.0") == (12, 9)
    assert min_cuda_for("10.0") == (12, 8)
    assert min_cuda_for("9.0") == (12, 0)
    assert min_cuda_for("7.0") is None
