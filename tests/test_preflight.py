"""Each preflight rule with a failing and a passing case, on the real config.json files of the
reference model (NemotronH Nano 30B NVFP4) and of Llama 3.1 8B; plus the reference spec itself."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from reconcile.plan.records import Finding
from reconcile.preflight.context import GpuFact, GpuProcess, PortHolder, PreflightInputs
from reconcile.preflight.gather import run_preflight
from reconcile.spec.models import Spec
from reconcile.vllm.memory import GiB

HERE = Path(__file__).resolve().parent
MODELS = HERE / "fixtures" / "models"
MODEL_DIR = "/root/models/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4"
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 262144}
MiB = 1024**2
RTX5090 = int(31.36 * GiB)


def load(name: str, file: str = "config.json") -> dict[str, Any]:
    data: dict[str, Any] = json.loads((MODELS / name / file).read_text())
    return data


BASE: dict[str, Any] = {
    "gpu": {"count": 2, "name": "NVIDIA GeForce RTX 5090", "compute_capability": "12.0", "memory_gib": 31.36},
    "cuda": {"home": "/usr/local/cuda", "gpu_arch": ["compute_120"],
             "headers": ["cublasLt.h", "curand_kernel.h", "nvrtc.h", "cusparse.h"]},
    "apt": {"packages": []},
    "venv": {"path": "/opt/vllm-venv", "packages": {"vllm": "==0.26.0", "ninja": "*"}},
    "model": {"repo": "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4", "dir": MODEL_DIR,
              "required_files": ["nano_v3_reasoning_parser.py", "chat_template.jinja"],
              "config": {"rope_parameters": YARN}},
    "api_key": {"file": "/root/vllm-api.key"},
    "server": {
        "name": "nemotron", "host": "0.0.0.0", "port": 20000, "log": "/var/log/vllm/nemotron.log",
        "args": {"tensor-parallel-size": 2, "max-model-len": 1048576, "max-num-seqs": 16,
                 "gpu-memory-utilization": 0.9, "enable-auto-tool-choice": True, "tool-call-parser": "hermes",
                 "reasoning-parser": "nano_v3",
                 "reasoning-parser-plugin": f"{MODEL_DIR}/nano_v3_reasoning_parser.py",
                 "enable-prefix-caching": True, "dtype": "bfloat16"},
        "env": {},
    },
}  # fmt: skip
FILES = {
    **{f"model-0000{i}-of-00005.safetensors": 3_900_000_000 for i in range(1, 6)},
    "config.json": 3_000,
    "hf_quant_config.json": 12_000,
    "chat_template.jinja": 6_000,
    "nano_v3_reasoning_parser.py": 4_000,
    "tokenizer.json": 17_000_000,
}


def spec(**sections: Any) -> Spec:
    """The reference deployment, with `section={key: value}` merged into it (None removes a key)."""
    data = copy.deepcopy(BASE)
    for name, changes in sections.items():
        for key, value in changes.items():
            target = data[name]
            if key in ("args", "env") and isinstance(value, dict):
                merged = {**target[key], **value}
                target[key] = {k: v for k, v in merged.items() if v is not None}
            elif value is None:
                target.pop(key, None)
            else:
                target[key] = value
    return Spec.model_validate(data)


def nemotron_config(**extra: Any) -> dict[str, Any]:
    return {**load("nemotron-h-nano"), "rope_parameters": YARN, **extra}


def rtx5090(index: int, free: int = int(30.8 * GiB)) -> GpuFact:
    return GpuFact(index, "NVIDIA GeForce RTX 5090", "12.0", RTX5090, free)


GOOD = PreflightInputs(
    vllm_version="0.26.0",
    vllm_version_source="installed",
    tool_parsers=frozenset({"hermes", "llama3_json", "mistral"}),
    reasoning_parsers=frozenset({"deepseek_r1", "qwen3"}),
    gpus=(rtx5090(0), rtx5090(1)),
    nvcc_path="/usr/local/cuda/bin/nvcc",
    nvcc_version="13.0",
    nvcc_arch_list=("compute_75", "compute_80", "compute_90", "compute_100", "compute_120"),
    headers_missing=(),
    venv_has_ninja=True,
    model_config=nemotron_config(),
    hf_quant_config=load("nemotron-h-nano", "hf_quant_config.json"),
    model_file_sizes=FILES,
    model_files=frozenset(FILES),
    port_state="free",
    api_key_configured=True,
)


def findings(s: Spec, inputs: PreflightInputs = GOOD, **changes: Any) -> list[Finding]:
    return list(run_preflight(s, inputs._replace(**changes)))


def of(found: list[Finding], rule: str) -> list[Finding]:
    return [f for f in found if f.rule == rule]


def the(found: list[Finding], rule: str) -> Finding:
    matching = of(found, rule)
    assert len(matching) == 1, (rule, found)
    return matching[0]


def test_the_reference_deployment_passes_every_rule() -> None:
    found = findings(spec())
    assert [f for f in found if f.severity != "info"] == []
    rules = {f.rule for f in found}
    assert {"flags.removed", "max-model-len.derived", "memory.fit", "toolchain.nvcc", "toolchain.arch",
            "toolchain.headers", "toolchain.ninja", "toolchain.path", "model.plugin", "model.chat-template",
            "model.parsers", "host.gpu-free", "host.port", "host.auth"} <= rules  # fmt: skip


def test_the_reference_spec_file_has_the_hand_calculated_memory_table() -> None:
    from reconcile.spec.loader import load_spec

    loaded = load_spec(str(HERE.parent / "specs" / "blackwell-2x5090.toml"))
    s = loaded.spec if hasattr(loaded, "spec") else loaded
    assert isinstance(s, Spec)
    config = {**load("nemotron-h-nano"), **(s.model.config if s.model else {})}
    found = findings(s, gpus=None, model_config=config, vllm_version="0.26.0rc1")
    fit = the(found, "memory.fit")
    # The spec turns prefix caching on, so vLLM 0.26 keeps NemotronH's Mamba state per block ("all"
    # mode, MambaModelConfig): attention blocks of whole 128-token SSD chunks, 128 x ceil(4,168 / 128)
    # = 4,224 tokens (page 1,081,344 B), and ceil(1,048,576 / 4,224) = 249 blocks in each of the 5
    # groups, x 6 layers = 7.52 GiB, not 1.53 GiB (prefix caching off); see tests/test_engine_memory.py.
    assert fit.message == "KV cache 7.52 GiB/GPU at 1,048,576 tokens (fp8); fits"
    assert fit.evidence["kv_bytes_per_token_per_gpu"] == 1536
    assert "= 28.22 GiB" in fit.evidence["table"]
    # vLLM's profile run at 2,048 tokens, per GPU at TP 2 (engine.budget.mamba2_profile_peak): a Mamba-2
    # layer holds 2,048 x 2 B x (2 x 2,688 hidden + 2,048 + 3,072 conv + 32 heads + 32 x 64) = 49.1 MiB
    # while Triton tunes its SSD kernels (256 MiB): 305.1 MiB, more than 36 B x 2,688 x 2,048 = 189 MiB.
    assert "activations 305.1 MiB (Mamba-2 layer peak)" in fit.evidence["table"]
    bf16 = the(findings(s, gpus=None, model_config=config, hf_quant_config=None), "memory.fit")
    assert bf16.evidence["kv_bytes_per_token_per_gpu"] == 3072
    # bf16: 128 x ceil(2,084 / 128) = 2,176-token blocks, 482 a group x 5 groups x 6 x 1,114,112 B
    assert bf16.message == "KV cache 15.00 GiB/GPU at 1,048,576 tokens (bfloat16); fits"


# --- 1. flags ---


def test_removed_rope_and_swap_flags_fail_with_their_replacement() -> None:
    s = spec(server={"args": {"rope-scaling": json.dumps(YARN), "swap-space": 16}})
    removed = of(findings(s), "flags.removed")
    assert {f.severity for f in removed} == {"error"}
    by_flag = {f.message.split()[0]: f for f in removed}
    assert "removed in vLLM 0.11.1" in by_flag["--rope-scaling"].message
    assert "rope_parameters = {" in by_flag["--rope-scaling"].fix
    assert "removed in vLLM 0.18.0" in by_flag["--swap-space"].message
    assert "drop args.swap-space" in by_flag["--swap-space"].fix


def test_swap_space_still_passes_on_0_17() -> None:
    s = spec(server={"args": {"swap-space": 16, "reasoning-parser-plugin": None}})
    assert the(findings(s, vllm_version="0.17.0"), "flags.removed").severity == "info"


def test_reasoning_parser_plugin_before_0_11_1_is_too_new() -> None:
    found = findings(spec(), vllm_version="0.11.0")
    f = the(found, "flags.too-new")
    assert f.severity == "error" and "--reasoning-parser-plugin needs vLLM >= 0.11.1" in f.message
    assert not of(findings(spec(), vllm_version="0.11.1"), "flags.too-new")


def test_too_new_under_a_lower_bound_pin_is_only_a_warning() -> None:
    s = spec(venv={"packages": {"vllm": ">=0.10.2", "ninja": "*"}})
    f = the(findings(s, vllm_version="0.10.2", vllm_version_source="spec pin"), "flags.too-new")
    assert f.severity == "warning"


def test_a_lower_bound_pin_warns_about_flags_newer_releases_dropped() -> None:
    s = spec(venv={"packages": {"vllm": ">=0.17.0", "ninja": "*"}}, server={"args": {"swap-space": 4}})
    f = the(findings(s, vllm_version="0.17.0", vllm_version_source="spec pin"), "flags.removed")
    assert f.severity == "warning" and "gone from vLLM 0.18.0 on" in f.message and '"<0.18.0"' in f.fix
    exact = spec(venv={"packages": {"vllm": "==0.17.0", "ninja": "*"}}, server={"args": {"swap-space": 4}})
    assert (
        the(findings(exact, vllm_version="0.17.0", vllm_version_source="spec pin"), "flags.removed").severity
        == "info"
    )


def test_a_flag_the_lists_cannot_decide_is_a_warning() -> None:
    from reconcile.vllm.flags import table

    new_in_025 = next(f for f, runs in table().runs.items() if runs[0][0] == "0.25.0")
    s = spec(server={"args": {new_in_025[2:]: True}})
    assert the(findings(s, vllm_version="0.22.0"), "flags.unknown").severity == "warning"


# --- 2. max-model-len ---


def test_max_model_len_above_the_derived_limit_fails_with_the_exact_value() -> None:
    f = the(findings(spec(server={"args": {"max-model-len": 1056768}})), "max-model-len.derived")
    assert f.severity == "error"
    assert "1,056,768" in f.message and "1,048,576" in f.message
    assert "args.max-model-len = 1048576 exactly" in f.fix
    assert f.evidence["vllm_error"].startswith(
        "User-specified max_model_len (1056768) is greater than the derived"
    )


def test_max_model_len_at_the_derived_limit_passes() -> None:
    assert the(findings(spec()), "max-model-len.derived").severity == "info"


def test_without_the_yarn_patch_the_fix_is_the_patch() -> None:
    f = the(findings(spec(), model_config=load("nemotron-h-nano")), "max-model-len.derived")
    assert f.severity == "error" and "262,144" in f.message
    assert 'rope_type = "yarn", factor = 4.0, original_max_position_embeddings = 262144' in f.fix


def test_from_0_30_yarn_no_longer_extends_the_limit() -> None:
    f = the(findings(spec(), vllm_version="0.30.0"), "max-model-len.derived")
    assert f.severity == "error" and "max_position_embeddings = 1048576" in f.fix


def test_allow_long_env_turns_the_error_into_a_warning_with_its_risk() -> None:
    s = spec(server={"args": {"max-model-len": 1056768}, "env": {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}})
    f = the(findings(s), "max-model-len.derived")
    assert f.severity == "warning" and "NaN" in f.message


def test_lowercase_k_is_decimal_for_llama() -> None:
    s = spec(
        server={"args": {"max-model-len": "128K", "reasoning-parser": None, "reasoning-parser-plugin": None}}
    )
    llama = load("llama-3.1-8b")
    ok = the(findings(s, model_config=llama, hf_quant_config=None), "max-model-len.derived")
    assert ok.severity == "info" and "131,072" in ok.message
    s = spec(server={"args": {"max-model-len": "132k"}})
    bad = the(findings(s, model_config=llama), "max-model-len.derived")
    assert bad.severity == "error" and "'132k' = 132,000" in bad.message


def test_auto_max_model_len_needs_0_14() -> None:
    s = spec(server={"args": {"max-model-len": "auto", "reasoning-parser-plugin": None}})
    assert the(findings(s, vllm_version="0.13.0"), "max-model-len.derived").severity == "error"
    assert the(findings(s, vllm_version="0.14.0"), "max-model-len.derived").severity == "info"


# --- 3. memory ---


def test_a_request_of_max_model_len_that_cannot_fit_fails_the_plan() -> None:
    s = spec(server={"args": {"max-model-len": 131072, "tensor-parallel-size": 1, "reasoning-parser": None,
                              "reasoning-parser-plugin": None}})  # fmt: skip
    llama = load("llama-3.1-8b")
    sizes = {f"model-0000{i}-of-00004.safetensors": 4_015_000_000 for i in range(1, 5)}
    gpu = (GpuFact(0, "NVIDIA GeForce RTX 4090", "8.9", 24 * GiB, int(23.5 * GiB)),)
    common: dict[str, Any] = {"model_config": llama, "hf_quant_config": None, "model_file_sizes": sizes}
    f = the(findings(s, gpus=gpu, **common), "memory.fit")
    assert f.severity == "error" and "131,072 tokens needs 16.00 GiB/GPU" in f.message
    assert "args.max-model-len <=" in f.fix
    h200 = (GpuFact(0, "NVIDIA H200", "9.0", int(139.8 * GiB), int(139 * GiB)),)
    ok = the(findings(s, gpus=h200, **common), "memory.fit")
    assert ok.severity == "info" and ok.message == "KV cache 16.00 GiB/GPU at 131,072 tokens (bfloat16); fits"


def test_memory_table_is_shown_with_the_passing_finding() -> None:
    table = the(findings(spec()), "memory.fit").evidence["table"]
    for row in ("budget", "weights", "KV per token", "KV at max-model-len", "Mamba state", "overhead (est.)",
                "headroom", "KV cache (pred.)"):  # fmt: skip
        assert row in table


def test_tensor_parallel_beyond_the_gpus_or_heads_fails() -> None:
    assert the(findings(spec(), gpus=(rtx5090(0),)), "memory.tp").severity == "error"
    s = spec(server={"args": {"tensor-parallel-size": 3}})
    found = of(findings(s, gpus=(rtx5090(0), rtx5090(1), rtx5090(2))), "memory.tp")
    assert any("32 attention heads" in f.message for f in found)
    assert not of(findings(spec()), "memory.tp")


# --- 4. toolchain ---


def test_nvcc_12_8_on_blackwell_fails_and_13_0_passes() -> None:
    f = the(findings(spec(), nvcc_version="12.8"), "toolchain.nvcc")
    assert f.severity == "error" and "SM 12.x requires CUDA >= 12.9" in f.message
    assert the(findings(spec()), "toolchain.nvcc").severity == "info"


def test_missing_nvcc_fails_unless_apply_brings_it() -> None:
    f = the(findings(spec(), nvcc_path=None, nvcc_version=None), "toolchain.nvcc")
    assert f.severity == "error" and "Could not find nvcc" in f.message
    s = spec(cuda={"target": "/usr/local/cuda-13.0"}, apt={"packages": ["cuda-nvcc-13-0"]})
    planned = the(findings(s, nvcc_path=None, nvcc_version=None), "toolchain.nvcc")
    assert planned.severity == "warning" and "apply brings CUDA 13.0" in planned.message
    old = spec(cuda={"target": "/usr/local/cuda-12.8"}, apt={"packages": ["cuda-nvcc-12-8"]})
    assert the(findings(old, nvcc_path=None, nvcc_version=None), "toolchain.nvcc").severity == "error"


def test_empty_arch_list_is_the_misleading_sm75_error() -> None:
    f = the(findings(spec(), nvcc_arch_list=()), "toolchain.arch")
    assert f.severity == "error" and "FlashInfer requires GPUs with sm75 or higher" in f.message
    lacking = the(findings(spec(), nvcc_arch_list=("compute_90",)), "toolchain.arch")
    assert lacking.severity == "error" and "compute_120" in lacking.message
    assert the(findings(spec()), "toolchain.arch").severity == "info"


def test_missing_headers_name_their_packages() -> None:
    f = the(findings(spec(), headers_missing=("curand_kernel.h", "cublasLt.h")), "toolchain.headers")
    assert f.severity == "error"
    assert "libcurand-dev-13-0" in f.fix and "libcublas-dev-13-0" in f.fix
    queued = spec(apt={"packages": ["libcurand-dev-13-0", "libcublas-dev-13-0"]})
    later = the(findings(queued, headers_missing=("curand_kernel.h", "cublasLt.h")), "toolchain.headers")
    assert later.severity == "warning" and "apply installs" in later.message
    assert the(findings(spec()), "toolchain.headers").severity == "info"


REFERENCE_APT = ["cuda-nvcc-13-0", "libcublas-dev-13-0", "libcurand-dev-13-0", "cuda-nvrtc-dev-13-0",
                 "libcusparse-dev-13-0"]  # fmt: skip
NO_TOOLKIT: dict[str, Any] = {
    "nvcc_path": None,
    "nvcc_version": None,
    "nvcc_arch_list": None,
    "headers_missing": None,
}


def test_before_the_toolkit_exists_apt_must_bring_every_listed_header() -> None:
    reference_apt = REFERENCE_APT
    s = spec(cuda={"target": "/usr/local/cuda-13.0"}, apt={"packages": reference_apt})
    bare = NO_TOOLKIT
    covered = the(findings(s, **bare), "toolchain.headers")
    assert covered.severity == "warning" and "apply installs" in covered.message
    short = spec(cuda={"target": "/usr/local/cuda-13.0"}, apt={"packages": reference_apt[:2]})
    gap = the(findings(short, **bare), "toolchain.headers")
    assert "not brought by [apt] packages" in gap.message and "cuda-nvrtc-dev-13-0" in gap.fix


def test_apply_installs_is_promised_only_for_packages_apt_knows() -> None:
    s = spec(cuda={"target": "/usr/local/cuda-13.0"}, apt={"packages": REFERENCE_APT})
    unknown = frozenset({"libcublas-dev-13-0", "libcurand-dev-13-0"})
    f = the(findings(s, **NO_TOOLKIT, apt_unknown=unknown), "toolchain.headers")
    assert f.severity == "warning" and "apply installs" not in f.message
    assert (
        "libcublas-dev-13-0, libcurand-dev-13-0, but apt on this machine cannot install them yet" in f.message
    )
    assert "[apt] repositories" in f.fix


def test_ninja_on_the_servers_path_is_enough(tmp_path: Path) -> None:
    from reconcile.preflight.gather import _ninja_on_path

    ninja = tmp_path / "bin" / "ninja"
    ninja.parent.mkdir()
    ninja.write_text("#!/bin/sh\n")
    ninja.chmod(0o755)
    s = spec(venv={"packages": {"vllm": "==0.26.0"}}, server={"env": {"PATH": f"{ninja.parent}:/usr/bin"}})
    assert _ninja_on_path(s) == str(ninja)
    f = the(findings(s, venv_has_ninja=False, ninja_on_path=str(ninja)), "toolchain.ninja")
    assert (f.severity, f.message) == ("info", f"ninja on the server's PATH: {ninja}")
    assert _ninja_on_path(spec(server={"env": {"PATH": str(tmp_path)}})) is None


def test_ninja_must_be_in_the_venv_or_in_its_packages() -> None:
    s = spec(venv={"packages": {"vllm": "==0.26.0"}})
    f = the(findings(s, venv_has_ninja=False), "toolchain.ninja")
    assert f.severity == "error" and 'ninja = "*"' in f.fix
    assert the(findings(spec(), venv_has_ninja=None), "toolchain.ninja").severity == "warning"
    no_jit = spec(venv={"packages": {"vllm": "==0.26.0"}}, cuda={"headers": []})
    assert the(findings(no_jit, venv_has_ninja=False), "toolchain.ninja").severity == "warning"
    assert the(findings(spec()), "toolchain.ninja").severity == "info"


def test_server_env_must_keep_venv_and_cuda_bin_first_on_path() -> None:
    s = spec(server={"env": {"PATH": "/usr/bin:/opt/vllm-venv/bin:/usr/local/cuda/bin"}})
    assert the(findings(s), "toolchain.path").severity == "error"
    s = spec(server={"env": {"CUDA_HOME": "/usr/local/cuda-12.8"}})
    assert "CUDA_HOME" in the(findings(s), "toolchain.path").message
    s = spec(
        server={
            "env": {"PATH": "/opt/vllm-venv/bin:/usr/local/cuda/bin:/usr/bin", "CUDA_HOME": "/usr/local/cuda"}
        }
    )
    assert the(findings(s), "toolchain.path").severity == "info"


# --- 5. model dir ---


def test_reasoning_plugin_file_must_be_in_the_model_dir() -> None:
    s = spec(model={"required_files": ["chat_template.jinja"]})
    f = the(findings(s, model_files=frozenset(FILES) - {"nano_v3_reasoning_parser.py"}), "model.plugin")
    assert f.severity == "error" and "invalid reasoning parser" in f.message
    later = the(
        findings(spec(), model_files=frozenset(FILES) - {"nano_v3_reasoning_parser.py"}), "model.plugin"
    )
    assert later.severity == "warning" and "apply downloads it" in later.message
    assert the(findings(spec()), "model.plugin").severity == "info"
    fresh = the(findings(s, model_files=frozenset(), model_file_sizes={}), "model.plugin")
    assert fresh.severity == "warning" and "apply downloads the model" in fresh.message


def test_the_ninth_gotcha_shipped_parser_without_the_plugin_flag() -> None:
    s = spec(server={"args": {"reasoning-parser-plugin": None}})
    f = the(findings(s), "model.plugin")
    assert f.severity == "error"
    assert f'args.reasoning-parser-plugin = "{MODEL_DIR}/nano_v3_reasoning_parser.py"' in f.fix
    assert the(findings(s, reasoning_parsers=None), "model.plugin").severity == "warning"


def test_tool_calling_needs_a_chat_template() -> None:
    f = the(findings(spec(), model_files=frozenset(FILES) - {"chat_template.jinja"}), "model.chat-template")
    assert f.severity == "error"
    assert the(findings(spec()), "model.chat-template").severity == "info"
    inline = {"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}
    files = frozenset(FILES) - {"chat_template.jinja"}
    assert (
        the(findings(spec(), model_files=files, tokenizer_config=inline), "model.chat-template").severity
        == "info"
    )


def test_parser_names_must_exist_in_the_installed_version() -> None:
    s = spec(server={"args": {"tool-call-parser": "hermez"}})
    f = the(findings(s), "model.parsers")
    assert f.severity == "error" and "hermes" in f.message
    s = spec(server={"args": {"tool-call-parser": None}})
    assert the(findings(s), "model.parsers").severity == "error"
    assert {f.severity for f in of(findings(spec()), "model.parsers")} == {"info"}


# --- 6. host ---


def test_foreign_gpu_memory_that_leaves_too_little_free_fails() -> None:
    # Gotcha 8: "Free memory on device cuda:1 (19.67/31.36 GiB) ... (0.9, 28.22 GiB)", zombie workers.
    zombie = GpuProcess(pid=31337, gpu_index=1, used_bytes=11 * 1024 * MiB, name="VLLM::Worker_TP1")
    gpus = (rtx5090(0), rtx5090(1, free=int(19.67 * GiB)))
    f = the(findings(spec(), gpus=gpus, foreign_gpu_processes=(zombie,)), "host.gpu-free")
    assert f.severity == "error"
    assert "GPU 1: 19.67/31.36 GiB free" in f.message and "VLLM::Worker_TP1 (pid 31337" in f.message
    assert f.evidence["processes"][0]["pid"] == 31337
    ours = the(findings(spec(), gpus=gpus, own_gpu_processes=(zombie,)), "host.gpu-free")
    assert ours.severity == "info"  # apply stops our own strays before starting
    assert the(findings(spec()), "host.gpu-free").severity == "info"


def test_port_held_by_someone_else_fails() -> None:
    f = the(findings(spec(), port_state="other", port_holder=PortHolder(4242, "nginx")), "host.port")
    assert f.severity == "error" and "nginx (pid 4242)" in f.message
    assert the(findings(spec(), port_state="ours"), "host.port").severity == "info"


def test_binding_all_interfaces_without_a_key_is_refused() -> None:
    s = spec(api_key={"file": "/root/vllm-api.key"})
    data = s.model_dump()
    data["api_key"] = None
    keyless = Spec.model_validate(data)
    assert the(findings(keyless, api_key_configured=False), "host.auth").severity == "error"
    assert the(findings(spec()), "host.auth").severity == "info"
    loopback = spec(server={"host": "127.0.0.1"})
    assert the(findings(loopback, api_key_configured=False), "host.auth").severity == "info"


def test_no_server_section_means_nothing_to_check() -> None:
    data = copy.deepcopy(BASE)
    del data["server"]
    assert run_preflight(Spec.model_validate(data), GOOD) == ()


@pytest.mark.parametrize("version", [None, "0.26.0"])
def test_every_finding_is_json_serialisable(version: str | None) -> None:
    found = findings(spec(server={"args": {"swap-space": 4}}), vllm_version=version, gpus=None)
    dumped = {
        f.rule: json.loads(json.dumps({"message": f.message, "evidence": dict(f.evidence)})) for f in found
    }
    (flags,) = of(found, "flags.removed")
    if version is None:
        assert flags.severity == "warning" and flags.message.startswith("vLLM version unknown")
    else:
        assert flags.severity == "error" and flags.message.startswith(
            "--swap-space was removed in vLLM 0.18.0"
        )
    assert dumped["flags.removed"]["message"] == flags.message
    assert dumped["memory.fit"]["evidence"]["headroom"] > 0  # evidence with numbers survives the trip


def test_memory_table_for_a_spec_or_why_not() -> None:
    from reconcile.preflight.gather import memory_table

    table = memory_table(spec(), GOOD)
    assert table.splitlines()[0].startswith("budget") and "= 28.22 GiB" in table.splitlines()[0]
    assert memory_table(spec(), GOOD._replace(model_config=None)) == "config.json not available yet"
