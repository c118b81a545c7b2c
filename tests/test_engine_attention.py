"""The MLA backend vLLM 0.26 picks and its block size, by compute capability, KV dtype, --block-size
and what the installed build holds (engine.attention), checked against the H200 oracle's figure.

The H200 lab (vLLM 0.26.0 wheel, FA3 and FlashMLA built in, no flashinfer) used 16-token blocks for
deepseek-v3 (FLASH_ATTN_MLA): "tp1.block_size: vLLM 16 reconcile 64; tp1.capacity_tokens: vLLM
152784 reconcile 152768" (gpu-results/s2/preflight-oracle.md), when reconcile assumed FlashMLA's 64.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from probes.venv import VenvObservation, read_venv
from reconcile.preflight.context import GpuFact
from reconcile.preflight.gather import _venv_facts
from reconcile.vllm.attention import STOCK_BUILD, Build, mla_backend, scan_build
from reconcile.vllm.kvgroups import kv_layout
from reconcile.vllm.kvspec import layer_specs
from reconcile.vllm.memory import GiB, estimate
from tests.test_preflight import findings, spec, the

CORPUS = Path(__file__).resolve().parent / "data" / "model_configs"
V3 = json.loads((CORPUS / "deepseek-v3.json").read_text())["config"]
LAB = Build(fa3=True, flashmla=True, flashinfer=False, tokenspeed=False)  # the H200 lab's --no-deps venv


@pytest.mark.parametrize(
    ("cc", "kv", "build", "name", "block"),
    [
        (90, "bfloat16", LAB, "FLASH_ATTN_MLA", 16),  # the H200 lab, as vLLM logged it
        (90, "bfloat16", STOCK_BUILD, "FLASH_ATTN_MLA", 16),
        (90, "fp8", LAB, "FLASHMLA", 64),  # FlashAttention MLA stores no fp8
        (90, "bfloat16", LAB._replace(fa3=False), "FLASHMLA", 64),  # a build without FA3
        (90, "bfloat16", Build(False, False, False, False), "TRITON_MLA", 16),
        (100, "bfloat16", STOCK_BUILD, "FLASHINFER_MLA", 32),  # B200: [32, 64], 16 not supported
        (100, "fp8", LAB, "CUTLASS_MLA", 128),  # no flashinfer, no tokenspeed_mla: CUTLASS's 128
        (100, "fp8", LAB._replace(tokenspeed=True), "TOKENSPEED_MLA", 32),
        (100, "bfloat16", LAB._replace(tokenspeed=True), "CUTLASS_MLA", 128),  # tokenspeed: fp8 only
        (120, "fp8", STOCK_BUILD, "TRITON_MLA", 16),  # RTX 5090 (the reference): Triton first on sm_12x
        (89, "fp8", STOCK_BUILD, "TRITON_MLA", 16),  # L40S
        (80, "bfloat16", STOCK_BUILD, "TRITON_MLA", 16),  # A100
        (75, "float16", STOCK_BUILD, "TRITON_MLA", 16),  # T4
    ],
)
def test_backend_and_block_follow_the_gpu_and_the_build(
    cc: int, kv: str, build: Build, name: str, block: int
) -> None:
    b = mla_backend(cc, V3, kv_cache_dtype=kv, build=build)
    assert (b.name, b.block_size) == (name, block), b.why


def test_block_size_flag_and_forced_backend() -> None:
    # --block-size 16 rules FlashMLA (64 only) out: Triton serves fp8 at the user's 16.
    b = mla_backend(90, V3, kv_cache_dtype="fp8", block_size=16, build=LAB)
    assert (b.name, b.block_size) == ("TRITON_MLA", 16) and "FLASHMLA (block-size 16 not supported)" in b.why
    assert mla_backend(90, V3, kv_cache_dtype="fp8", block_size=128, build=LAB)[:2] == ("FLASHMLA", 128)
    assert mla_backend(90, V3, forced="flashmla", build=LAB)[:2] == ("FLASHMLA", 64)
    refused = mla_backend(90, V3, forced="CUTLASS_MLA", build=LAB)
    assert refused.block_size == 128 and "vLLM refuses it here: sm_9x not supported" in refused.why
    # FlashInfer MLA's kernel takes qk_nope_head_dim 64/128/192 only: a 256 model gets CUTLASS on sm_100.
    assert mla_backend(100, {**V3, "qk_nope_head_dim": 256})[:2] == ("CUTLASS_MLA", 128)
    none = mla_backend(90, V3, kv_cache_dtype="fp8_e5m2", build=LAB)  # no MLA backend stores e5m2
    assert none.name == "none" and "TRITON_MLA (kv-cache-dtype fp8_e5m2 not supported)" in none.why
    assert mla_backend(None, V3)[:2] == ("unknown", 16)


def test_deepseek_v3_capacity_is_the_h200_oracles() -> None:
    # Before: FlashMLA's 64-token blocks gave 152,768 tokens in 10 GiB; vLLM (16-token blocks) 152,784.
    ten = 10 * GiB
    old = kv_layout(layer_specs(V3, tp=8, backend_block=64))
    assert (old.min_block_size, old.capacity_tokens(ten)) == (64, 152_768)
    h200: dict[str, Any] = {"tp": 8, "total_bytes": 150_109_880_320, "gpu": "NVIDIA H200", "utilization": 0.9,
                            "max_model_len": 163840, "capability": 90, "build": LAB}  # fmt: skip
    e = estimate(V3, None, {}, args={}, **h200)
    assert e.attention_backend is not None and e.attention_backend.name == "FLASH_ATTN_MLA"
    assert e.layout is not None and e.layout.min_block_size == 16
    assert e.layout.capacity_tokens(ten) == 152_784
    fp8 = estimate(V3, None, {}, args={"kv-cache-dtype": "fp8"}, **h200)
    assert fp8.layout is not None and fp8.layout.min_block_size == 64  # FlashMLA


def _touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")


def test_scan_build_reads_the_files_an_import_would_load(tmp_path: Path) -> None:
    site = tmp_path / "site"
    assert scan_build([str(site)]) is None  # no vllm package: the caller assumes the stock wheel
    _touch(site / "vllm" / "__init__.py")
    assert scan_build([str(site)]) == Build(False, False, False, False)
    _touch(site / "vllm" / "vllm_flash_attn" / "_vllm_fa3_C.abi3.so")
    _touch(site / "vllm" / "_flashmla_C.cpython-312-x86_64-linux-gnu.so")
    assert scan_build([str(site)]) == Build(True, False, False, False)  # FlashMLA needs both modules
    _touch(site / "vllm" / "_flashmla_extension_C.abi3.so")
    other = tmp_path / "other"
    _touch(other / "flashinfer" / "__init__.py")  # a dir a .pth file adds
    (other / "tokenspeed_mla").mkdir()  # no __init__.py: not importable as a package
    assert scan_build([str(site), str(other)]) == Build(True, True, True, False)


def test_the_plan_reads_the_venvs_build_and_the_gpu(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    site = venv / "lib" / "python3.12" / "site-packages"
    _touch(venv / "pyvenv.cfg")
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.12.3\n")
    _touch(site / "vllm" / "__init__.py")
    _touch(site / "vllm" / "vllm_flash_attn" / "_vllm_fa3_C.abi3.so")
    extra = tmp_path / "torch-site"
    _touch(extra / "flashinfer" / "__init__.py")
    (site / "torch.pth").write_text(f"{extra}\n")
    observed = read_venv(str(venv))
    assert isinstance(observed, VenvObservation)
    build = _venv_facts(observed)["attention_build"]
    assert build == Build(fa3=True, flashmla=False, flashinfer=True, tokenspeed=False)
    s = spec(server={"args": {"tensor-parallel-size": 8, "max-model-len": 8192, "reasoning-parser": None}})
    common: dict[str, Any] = {"model_config": V3, "hf_quant_config": None, "attention_build": build}
    h200 = tuple(GpuFact(i, "NVIDIA H200", "9.0", 150_109_880_320, 150_000_000_000) for i in range(8))
    table = the(findings(s, gpus=h200, **common), "memory.fit").evidence["table"]
    assert "one request of 8,192 tokens in 16-token blocks (FLASH_ATTN_MLA)" in table
    b200 = tuple(g._replace(name="NVIDIA B200", compute_capability="10.0") for g in h200)
    table = the(findings(s, gpus=b200, **common), "memory.fit").evidence["table"]
    assert "in 32-token blocks (FLASHINFER_MLA)" in table
