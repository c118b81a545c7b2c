"""Issue 28's served rows (one H200, vLLM 0.26.0): the plan's layout against what vLLM logged, for
architectures the corpus never had. Each file under tests/data/served_issue28 keeps the tiny model's
config.json, its files' sizes and vLLM's log figures (docs/preflight.md, "Issue 28")."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from reconcile.vllm.limits import derive_max_model_len
from reconcile.vllm.memory import GiB, MemoryEstimate, estimate

ROWS = Path(__file__).resolve().parent / "data" / "served_issue28"
CUDA_TOTAL = 150_109_880_320  # the lab H200's cudaMemGetInfo total


def _row(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ROWS / f"{name}.json").read_text())
    return data


def _plan(name: str) -> MemoryEstimate:
    row = _row(name)
    flags = row["flags"]
    return estimate(row["config"], None, row["file_sizes"], tp=1, total_bytes=CUDA_TOTAL, gpu="NVIDIA H200",
                    utilization=float(flags.get("gpu-memory-utilization", 0.1)),
                    max_model_len=derive_max_model_len(row["config"], "0.26.0").default,
                    args={"enforce-eager": True, **flags})  # fmt: skip


@pytest.mark.parametrize("name", ["cohere2", "llama4-text", "granite-h", "zamba2", "nemotronh-pad"])
def test_the_layout_gives_vllms_tokens_on_vllms_memory(name: str) -> None:
    """Some block count inside the logged "Available KV cache memory" (0.01 GiB) gives exactly the
    logged "GPU KV cache size", and the attention block is the one vLLM set."""
    logged = _row(name)["logged"]
    e = _plan(name)
    assert e.layout is not None and e.max_model_len and logged["started"] and e.fits
    low, high = int((logged["available_gib"] - 0.005) * GiB), int((logged["available_gib"] + 0.005) * GiB)
    block = e.layout.block_bytes
    got = {
        e.layout.capacity_tokens(n * block, e.max_model_len, e.in_flight_tokens, e.mamba_mode)
        for n in range(low // block, high // block + 1)
    }
    assert logged["tokens"] in got
    assert logged["block_size"] in (None, e.layout.min_block_size)


def test_nemotron_nanos_pattern_pads_one_mamba_layer_as_vllm_does() -> None:
    e = _plan("nemotronh-pad")
    assert e.layout is not None
    # 6 attention + 23 Mamba layers in groups of 6: 4 Mamba groups, the last one padded by one layer
    # (vLLM: "Add 1 padding layers, may waste at most 4.35% KV cache memory"; 1 / 23 = 4.35%).
    assert (len(e.layout.groups), e.layout.group_size, e.layout.padding_layers) == (5, 6, 1)
    assert e.layout.min_block_size == 2096


def test_the_budget_flag_verdicts_are_vllms() -> None:
    nofit, fits = _plan("dense-kvbytes-nofit"), _plan("dense-kvbytes-fits")
    graphs = _plan("mamba-kvbytes-graphs")
    refused = _row("dense-kvbytes-nofit")["logged"]
    assert not nofit.fits and not refused["started"]
    assert "estimated maximum model length is 2048" in " ".join(refused["lines"])
    assert nofit.max_len_that_fits == 2048
    assert fits.fits and fits.kv_capacity_tokens == _row("dense-kvbytes-fits")["logged"]["tokens"] == 32768
    # With CUDA graphs each of the 1,024 default sequences needs a Mamba block: 6 MiB holds 85.
    said = " ".join(_row("mamba-kvbytes-graphs")["logged"]["lines"])
    blocks = int(re.search(r"available Mamba cache blocks \((\d+)\)", said).group(1))  # type: ignore[union-attr]
    assert graphs.fits and graphs.layout is not None
    assert graphs.layout.num_blocks(graphs.available_for_cache) == blocks < graphs.max_num_seqs
