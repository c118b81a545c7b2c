"""Parallelism rules (`memory.tp`): TP x PP x DP against the probed GPUs or the spec's [gpu] count, and
the head counts vLLM 0.26 requires tensor parallel to divide. Each with a failing and a passing case."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reconcile.plan.records import Finding
from tests.test_preflight import findings, load, of, rtx5090, spec, the

NO_PARSER: dict[str, Any] = {"reasoning-parser": None, "reasoning-parser-plugin": None}


def tp_errors(found: list[Finding]) -> list[str]:
    return [f.message for f in of(found, "memory.tp") if f.severity == "error"]


def test_tp_8_on_4_probed_gpus_fails_and_on_8_passes() -> None:
    s = spec(server={"args": {"tensor-parallel-size": 8}})
    four = tuple(rtx5090(i) for i in range(4))
    assert tp_errors(findings(s, gpus=four)) == ["tensor-parallel-size 8 needs 8 GPUs; 4 visible"]
    assert tp_errors(findings(s, gpus=tuple(rtx5090(i) for i in range(8)))) == []


def test_without_nvml_the_spec_gpu_count_is_the_limit() -> None:
    s = spec(server={"args": {"tensor-parallel-size": 8}}, gpu={"count": 4})
    f = of(findings(s, gpus=None), "memory.tp")
    assert [x.message for x in f] == ["tensor-parallel-size 8 needs 8 GPUs; 4 in [gpu] count (not probed)"]
    assert f[0].fix == "set args.tensor-parallel-size = 4"
    assert (
        tp_errors(findings(spec(server={"args": {"tensor-parallel-size": 8}}, gpu={"count": 8}), gpus=None))
        == []
    )


def test_pipeline_and_data_parallel_ranks_need_their_own_gpus() -> None:
    s = spec(server={"args": {"pipeline-parallel-size": 2}})
    errors = tp_errors(findings(s))  # the reference machine has 2 GPUs: TP 2 x PP 2 needs 4
    assert errors == ["tensor-parallel-size 2 x pipeline-parallel-size 2 needs 4 GPUs; 2 visible"]
    assert tp_errors(findings(s, gpus=tuple(rtx5090(i) for i in range(4)))) == []
    dp = spec(server={"args": {"data-parallel-size": 2}}, gpu={"count": 2})
    assert "x data-parallel-size 2 needs 4 GPUs" in tp_errors(findings(dp, gpus=None))[0]


def test_kv_heads_must_divide_or_be_divided_by_tp() -> None:
    # 28 query heads and 4 KV heads (Qwen2.5-7B's shape): TP 7 splits the queries but not the KV heads.
    qwen = {**load("llama-3.1-8b"), "num_attention_heads": 28, "num_key_value_heads": 4, "hidden_size": 3584}
    s = spec(server={"args": {"tensor-parallel-size": 7, **NO_PARSER}})
    seven = tuple(rtx5090(i) for i in range(7))
    errors = tp_errors(findings(s, gpus=seven, model_config=qwen, hf_quant_config=None))
    assert errors == [
        "4 KV heads cannot be split over tensor-parallel-size 7: vLLM needs one to divide the other "
        '(it fails with "7 is not divisible by 4")'
    ]
    fix = next(f.fix for f in findings(s, gpus=seven, model_config=qwen) if f.rule == "memory.tp")
    assert fix == "use a tensor-parallel-size of 4 or 8"
    # TP 8 > 4 KV heads: each is replicated twice, which vLLM allows (28 heads then fail on their own).
    eight = spec(server={"args": {"tensor-parallel-size": 8, **NO_PARSER}})
    errors = tp_errors(findings(eight, gpus=(*seven, rtx5090(7)), model_config=qwen, hf_quant_config=None))
    assert errors == ["28 attention heads do not divide by tensor-parallel-size 8"]
    four = spec(server={"args": {"tensor-parallel-size": 4, **NO_PARSER}})
    assert tp_errors(findings(four, gpus=seven[:4], model_config=qwen, hf_quant_config=None)) == []


def test_mamba_heads_and_groups_must_divide_by_tp() -> None:
    # NemotronH Nano: 64 Mamba heads, 8 groups. TP 16 splits the heads by 4 and leaves half a group each.
    config = {**load("nemotron-h-nano"), "num_attention_heads": 32, "mamba_num_heads": 64, "n_groups": 8}
    s = spec(server={"args": {"tensor-parallel-size": 16}})
    sixteen = tuple(rtx5090(i) for i in range(16))
    errors = tp_errors(findings(s, gpus=sixteen, model_config=config))
    assert errors == [
        "8 Mamba groups do not divide by tensor-parallel-size 16 (vLLM replicates groups only when there is "
        'one: "... then num_groups must equal 1.")'
    ]
    one_group = {**config, "n_groups": 1}
    assert tp_errors(findings(s, gpus=sixteen, model_config=one_group)) == []
    odd = {**config, "mamba_num_heads": 40}
    assert any("40 Mamba heads" in m for m in tp_errors(findings(s, gpus=sixteen, model_config=odd)))


# The lab's tiny Llama (shared/gpu-lab/make_tiny_model.py) as the h200-lab spec's patch leaves it.
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
    "vocab_size": 512, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 2048,
    "rope_parameters": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 2048,
                        "rope_theta": 10000.0},
}  # fmt: skip
TINY_WEIGHTS = 901_120  # model.safetensors


def lab_fit(tmp_path: Path, tp: int, gpus: int | None) -> tuple[Finding, list[str]]:
    """memory.fit and the memory.tp errors for specs/h200-lab.toml at `tp` with [gpu] count 2, on `gpus`
    fake H200s (None: no NVML, the spec's memory_gib)."""
    from probes import gpu
    from reconcile.plan.prober import Observed
    from reconcile.preflight.gather import inputs_from, run_preflight
    from reconcile.spec.loader import load_spec
    from tests.fakes import fake_nvml

    text = (Path(__file__).resolve().parent.parent / "specs" / "h200-lab.toml").read_text()
    text = text.replace("count = 1", "count = 2").replace(
        "args = { ", f"args = {{ tensor-parallel-size = {tp}, "
    )
    (tmp_path / "lab.toml").write_text(text)
    s = load_spec(str(tmp_path / "lab.toml")).spec
    seen = gpu.probe(s, nvml=fake_nvml.h200(gpus)) if gpus else None
    inputs = inputs_from(s, Observed(gpu=seen))
    files = {"model.safetensors": TINY_WEIGHTS, "config.json": 700}
    found = run_preflight(
        s,
        inputs._replace(
            vllm_version="0.26.0",
            vllm_version_source="installed",
            model_config=TINY_LLAMA,
            model_file_sizes=files,
            model_files=frozenset(files),
        ),
    )
    return the(list(found), "memory.fit"), tp_errors(list(found))


def test_the_lab_spec_at_tp_2_budgets_each_gpu_and_splits_weights_and_kv_heads_as_vllm(
    tmp_path: Path,
) -> None:
    # Per GPU, as vLLM's worker counts it (each rank profiles its own GPU; the engine takes the least):
    # budget = 0.3 x CUDA's total = 0.3 x (143,771 - 615 reserved) MiB, the same at TP 1 and TP 2;
    # weights / TP; KV heads max(1, 2 // TP) = 1 (get_num_kv_heads): 2 x 1 x 64 x 2 B x 2 layers = 512 B
    # a token; NCCL's buffers +0.25 GiB; activations 8,192 x 128 x 36; logits 512 x 1,024 x 4; no
    # graphs (enforce-eager); RoPE cache 4,096 positions (YaRN 2,048 x 2) x 64 x 2 B.
    budget = int((143_771 - 615) * 2**20 * 0.3)
    overhead = 2**29 + 8192 * 128 * 36 + 512 * 1024 * 4 + 4096 * 64 * 2
    available = budget - TINY_WEIGHTS // 2 - overhead
    blocks = available // (16 * 512)  # one block: 16 tokens x 512 B, both layers (one KV cache group)
    two, errors = lab_fit(tmp_path, 2, gpus=2)
    assert errors == []  # 2 heads and 2 KV heads divide by 2; 2 GPUs probed
    # One request: 64 blocks x 16 tokens x 512 B = 524,288 B on each GPU.
    assert two.severity == "info" and two.message == "KV cache 524,288 B/GPU at 1,024 tokens (bfloat16); fits"
    e = two.evidence
    assert (e["budget"], e["weights_per_gpu"], e["kv_bytes_per_token_per_gpu"]) == (budget, 450_560, 512)
    # vLLM logs concurrency x max-model-len: blocks / 64 a request x 1,024 = blocks x 16 tokens.
    assert e["predicted_kv_cache_tokens"] == blocks * 16 == 86_826_736
    one = lab_fit(tmp_path, 1, gpus=2)[0].evidence
    assert (one["budget"], one["weights_per_gpu"], one["kv_bytes_per_token_per_gpu"]) == (
        budget,
        901_120,
        1024,
    )
    # No NVML: [gpu] memory_gib 139.8 is the per-GPU total; the division is the same.
    unprobed = lab_fit(tmp_path, 2, gpus=None)[0].evidence
    assert (unprobed["budget"], unprobed["kv_bytes_per_token_per_gpu"]) == (
        int(int(139.8 * 2**30) * 0.3),
        512,
    )
    assert lab_fit(tmp_path, 2, gpus=1)[1] == ["tensor-parallel-size 2 needs 2 GPUs; 1 visible"]
