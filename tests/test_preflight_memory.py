"""`memory.fit` before the download and at its edges: weights from an index, the hub or an estimate
(never "fits" on weights counted as 0), weights over the budget naming the TP that fits, an unset
max-model-len checked as the derived one, pipeline parallel, Mamba blocks vs max-num-seqs, and
negative headroom never under "fits"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reconcile.preflight.context import GpuFact, WeightsFact
from reconcile.vllm.memory import GiB
from reconcile.vllm.weights import estimate, index_total, parameters
from tests.test_preflight import findings, load, rtx5090, spec, the

NO_PARSER: dict[str, Any] = {"reasoning-parser": None, "reasoning-parser-plugin": None}
H100 = GpuFact(0, "NVIDIA H100 80GB HBM3", "9.0", int(79.2 * GiB), int(78.5 * GiB))
RTX4090 = (GpuFact(0, "NVIDIA GeForce RTX 4090", "8.9", 24 * GiB, int(23.5 * GiB)),)
# Llama-3.1-70B-Instruct's config.json (fields the memory math reads) and its index's total_size.
LLAMA_70B = {**load("llama-3.1-8b"), "hidden_size": 8192, "intermediate_size": 28672,
             "num_attention_heads": 64, "num_hidden_layers": 80, "num_key_value_heads": 8}  # fmt: skip
LLAMA_70B_BYTES = 141_107_412_992
LLAMA_8B_BYTES = 16_060_522_496  # model.safetensors.index.json metadata.total_size
CORPUS = Path(__file__).resolve().parent / "data" / "model_configs"


def fit(s: Any, **inputs: Any) -> Any:
    return the(findings(s, **inputs), "memory.fit")


def test_estimated_parameters_match_the_published_counts() -> None:
    assert abs(parameters(load("llama-3.1-8b"))[0] - 8_030_261_248) / 8_030_261_248 < 0.001
    assert abs(parameters(LLAMA_70B)[0] - 70_553_706_496) / 70_553_706_496 < 0.001
    assert abs(estimate(load("llama-3.1-8b"), None).total_bytes - LLAMA_8B_BYTES) / LLAMA_8B_BYTES < 0.001
    nvfp4 = estimate(load("nemotron-h-nano"), load("nemotron-h-nano", "hf_quant_config.json"))
    assert "at 4.5 bits (NVFP4)" in nvfp4.how and 15e9 < nvfp4.total_bytes < 21e9
    assert index_total({"metadata": {"total_size": LLAMA_8B_BYTES}, "weight_map": {}}) == LLAMA_8B_BYTES
    assert index_total({"weight_map": {}}) is None


def test_a_141_gb_model_on_one_80_gb_gpu_never_fits_before_download() -> None:
    s = spec(server={"args": {"tensor-parallel-size": 1, "max-model-len": 8192, **NO_PARSER}})
    common: dict[str, Any] = {"gpus": (H100,), "model_config": LLAMA_70B, "hf_quant_config": None}
    f = fit(s, model_file_sizes={}, model_files=frozenset(), **common)  # not downloaded, nothing known
    assert f.severity == "error" and f.message.startswith("the weights alone exceed the budget: ")
    assert "(weights estimated from config.json)" in f.message and "-" not in f.message.split("budget")[1]
    assert "gpu-memory-utilization" not in f.fix
    assert f.fix.splitlines()[0] == "set args.tensor-parallel-size = 2 (the smallest that fits; 2 GPUs)"
    assert "an FP8 checkpoint of the model" in f.fix
    fp8_kv = spec(
        server={"args": {"tensor-parallel-size": 1, "max-model-len": 8192, "kv-cache-dtype": "fp8"}}
    )
    assert (
        "an FP8 checkpoint" in fit(fp8_kv, model_file_sizes={}, **common).fix
    )  # the KV dtype is not the weights'
    assert "estimated (70.55B parameters x 2 B (bfloat16)) / TP 1" in f.evidence["table"]
    # The same from the index's total_size: no longer an estimate.
    known = WeightsFact(LLAMA_70B_BYTES, 0, "model.safetensors.index.json in /src")
    g = fit(s, model_file_sizes={}, weights=known, **common)
    assert g.severity == "error" and "estimated" not in g.message
    assert "(model.safetensors.index.json in /src) / TP 1" in g.evidence["table"]
    two = spec(server={"args": {"tensor-parallel-size": 2, "max-model-len": 8192, **NO_PARSER}})
    h100s = (H100, GpuFact(1, H100.name, "9.0", H100.total_bytes, H100.free_bytes))
    ok = fit(two, model_file_sizes={}, weights=known, **{**common, "gpus": h100s})
    assert ok.severity == "info" and ok.message.endswith("; fits")
    # 40 GiB of weights fit under the 71 GiB budget; the activations of 1M batched tokens do not.
    args = {"tensor-parallel-size": 1, "max-model-len": 8192, "max-num-batched-tokens": 1 << 20, **NO_PARSER}
    busy = spec(server={"args": args})
    half = WeightsFact(40 * GiB, 0, "model.safetensors.index.json in /src")
    full = fit(busy, model_file_sizes={}, weights=half, **common)
    assert full.severity == "error" and full.message.startswith("the weights and overhead fill the budget: ")


def test_estimated_weights_are_a_warning_never_a_plain_fits() -> None:
    s = spec(server={"args": {"tensor-parallel-size": 1, "max-model-len": 8192, **NO_PARSER}})
    f = fit(s, gpus=(H100,), model_config=load("llama-3.1-8b"), hf_quant_config=None, model_file_sizes={})
    assert f.severity == "warning" and f.message.endswith("fits (weights estimated from config.json)")
    assert f.evidence["weights_source"].startswith("estimated: 8.03B parameters")


def test_an_unset_max_model_len_is_checked_as_the_derived_one() -> None:
    # vLLM serves Llama 3.1 at 131,072 tokens when max-model-len is unset: 16 GiB of KV on a 24 GB card.
    s = spec(server={"args": {"tensor-parallel-size": 1, "max-model-len": None, **NO_PARSER}})
    sizes = {f"model-0000{i}-of-00004.safetensors": 4_015_000_000 for i in range(1, 5)}
    common: dict[str, Any] = {
        "model_config": load("llama-3.1-8b"),
        "hf_quant_config": None,
        "model_file_sizes": sizes,
    }
    f = fit(s, gpus=RTX4090, **common)
    assert f.severity == "error"
    assert f.message.startswith(
        "one request of 131,072 tokens (max-model-len unset: the derived length) needs 16.00 GiB"
    )
    ok = fit(s, gpus=(H100,), **common)
    assert (
        ok.severity == "info"
        and "at 131,072 tokens (bfloat16; max-model-len unset: the derived length)" in ok.message
    )


def test_pipeline_parallel_divides_the_weights_per_gpu() -> None:
    two = spec(server={"args": {"tensor-parallel-size": 2}})
    both = spec(server={"args": {"tensor-parallel-size": 2, "pipeline-parallel-size": 2}})
    gpus = tuple(rtx5090(i) for i in range(4))
    tp = fit(two, gpus=gpus).evidence["weights_per_gpu"]
    pp = fit(both, gpus=gpus).evidence["weights_per_gpu"]
    assert pp == tp // 2
    assert "/ TP 2 x PP 2" in fit(both, gpus=gpus).evidence["table"]


def test_more_sequences_than_mamba_cache_blocks_stops_cuda_graph_capture() -> None:
    gpus = (rtx5090(0), rtx5090(1))
    # Prefix caching off (a hybrid's vLLM 0.26 default): each request keeps one Mamba state block.
    off = {"enable-prefix-caching": False, "gpu-memory-utilization": 0.45}
    s = spec(server={"args": {"max-num-seqs": 1024, **off}})
    f = fit(s, gpus=gpus)
    assert f.severity == "error" and "exceeds available Mamba cache blocks (" in f.message
    assert f.fix.startswith(f"set args.max-num-seqs <= {f.evidence['mamba_blocks']}")
    eager = spec(server={"args": {"max-num-seqs": 1024, "enforce-eager": True, **off}})
    assert "Mamba cache blocks" not in fit(eager, gpus=gpus).message
    assert fit(spec(server={"args": {"max-num-seqs": 16, **off}}), gpus=gpus).severity == "info"


def test_negative_headroom_is_never_shown_under_fits() -> None:
    f = fit(spec(server={"args": {"max-num-seqs": 1024}}))
    assert f.severity == "warning" and "fits, but 1024 sequences' Mamba state" in f.message
    assert "short by" in f.evidence["table"] and "headroom" not in f.evidence["table"]
    assert f.evidence["headroom"] < 0 and f.fix.startswith("lower args.max-num-seqs to ")
    ok = fit(spec())
    assert ok.severity == "info" and ok.evidence["headroom"] > 0 and "headroom" in ok.evidence["table"]


def test_every_memory_finding_is_json_serialisable() -> None:
    s = spec(server={"args": {"tensor-parallel-size": 1, **NO_PARSER}})
    found = findings(s, gpus=(H100,), model_config=LLAMA_70B, hf_quant_config=None, model_file_sizes={})
    dumped = {f.rule: json.loads(json.dumps({"evidence": dict(f.evidence)})) for f in found}
    (fit,) = [f for f in found if f.rule == "memory.fit"]
    assert fit.severity == "error" and fit.message.startswith("the weights alone exceed the budget")
    assert dumped["memory.fit"]["evidence"]["headroom"] == fit.evidence["headroom"] < 0


def test_an_unset_length_of_a_longrope_model_is_its_original_length() -> None:
    # Phi-3.5-mini: LongRoPE, 131,072 positions, but vLLM serves 4,096 when max-model-len is unset.
    phi = json.loads((CORPUS / "phi-3.5-mini-instruct.json").read_text())["config"]
    s = spec(server={"args": {"tensor-parallel-size": 1, "max-model-len": None, **NO_PARSER}})
    found = findings(s, gpus=(H100,), model_config=phi, hf_quant_config=None, model_file_sizes={})
    assert the(found, "max-model-len.derived").message.startswith("max-model-len unset: vLLM serves 4,096 (")
    assert "4,096 tokens (bfloat16; max-model-len unset" in the(found, "memory.fit").message
