"""Flags of vLLM 0.26 that size the KV cache instead of gpu-memory-utilization: --kv-cache-memory-bytes
(Worker.determine_available_memory returns it, no profile) and --num-gpu-blocks-override
(get_kv_cache_configs: override x bytes of one block). Issue 28: with 3 GiB the plan said "fits" for a
request vLLM refused."""

from __future__ import annotations

from typing import Any

from reconcile.vllm.limits import human_int
from reconcile.vllm.memory import GiB, estimate
from tests.test_engine_memory import load
from tests.test_preflight import findings, spec, the
from tests.test_preflight_memory import H100, NO_PARSER


def _llama(**args: Any) -> Any:
    return estimate(load("llama-3.1-8b"), None, {"model.safetensors": 16 * GiB}, tp=1,
                    total_bytes=int(79.14 * GiB), gpu="NVIDIA H100 80GB HBM3", utilization=0.9,
                    max_model_len=131072, args=args)  # fmt: skip


def test_kv_cache_memory_bytes_is_the_cache_whatever_the_utilization() -> None:
    free = _llama()
    assert free.fits and free.available_for_cache > 40 * GiB  # 16 GiB of one request fits in ~50
    small = _llama(**{"kv-cache-memory-bytes": "3G"})
    assert small.available_for_cache == 3 * 2**30 and small.budget_source == "--kv-cache-memory-bytes"
    assert not small.fits and small.one_request == free.one_request
    # Full attention: 16-token blocks of 128 KiB a token; concurrency x length = blocks x 16 tokens.
    assert small.kv_capacity_tokens == 3 * 2**30 // (16 * 131072) * 16 == 24576
    assert _llama(**{"kv-cache-memory-bytes": "3g"}).available_for_cache == 3 * 10**9


def test_num_gpu_blocks_override_fixes_the_blocks() -> None:
    e = _llama(**{"num-gpu-blocks-override": 1000})
    assert e.layout is not None and e.available_for_cache == 1000 * e.layout.block_bytes
    assert e.kv_capacity_tokens == 16000 and not e.fits  # 131,072 tokens need 8,192 blocks


def test_human_readable_ints_as_vllm_reads_them() -> None:
    assert [human_int(v) for v in ("3G", "3g", "25.6k", "4096", 7)] == [3 * 2**30, 3 * 10**9, 25600, 4096, 7]
    assert human_int("1.5G") is None and human_int(True) is None and human_int("lots") is None


def test_the_plan_refuses_what_the_flag_cannot_hold() -> None:
    args = {"tensor-parallel-size": 1, "max-model-len": 131072, **NO_PARSER}
    common: dict[str, Any] = {"gpus": (H100,), "model_config": load("llama-3.1-8b"), "hf_quant_config": None,
                              "model_file_sizes": {"model.safetensors": 16 * GiB}}  # fmt: skip
    assert the(findings(spec(server={"args": args}), **common), "memory.fit").severity == "info"
    f = the(findings(spec(server={"args": {**args, "kv-cache-memory-bytes": "3G"}}), **common), "memory.fit")
    assert f.severity == "error"
    assert "16.00 GiB/GPU of cache; 3.00 GiB is what --kv-cache-memory-bytes gives the cache" in f.message
    assert "raise kv-cache-memory-bytes" in f.fix
    assert "--kv-cache-memory-bytes: as given; vLLM skips its memory profile" in f.evidence["table"]


def test_mamba_block_size_is_the_base_of_all_modes_attention_block() -> None:
    from tests.test_engine_memory import _reference

    nemotron = load("nemotron-h-nano")
    # _align_hybrid_block_size, "all" mode: lcm(base, 16) x ceil(4,168 tokens a Mamba state / it);
    # the base is the SSD chunk (128) unless --mamba-block-size sets it.
    blocks = [_reference(nemotron, **{"enable-prefix-caching": True, **a}).layout for a in
              ({}, {"mamba-block-size": 256}, {"mamba-block-size": "1000"})]  # fmt: skip
    assert [lay.min_block_size for lay in blocks if lay] == [128 * 33, 256 * 17, 2000 * 3]  # lcm(1000, 16)
    off = _reference(nemotron, **{"mamba-block-size": 256}).layout  # prefix caching off: no effect
    assert off is not None and off.min_block_size == _reference(nemotron).layout.min_block_size  # type: ignore[union-attr]


def test_batched_tokens_are_read_as_vllm_reads_them() -> None:
    assert _llama(**{"max-num-batched-tokens": "4K"}).batched_tokens == 4096
    assert _llama(**{"max-num-batched-tokens": 2048}).batched_tokens == 2048
