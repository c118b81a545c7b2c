"""The reference spec's memory table before the model is downloaded (packaged known-model config)."""

from __future__ import annotations

import os

import pytest

from reconcile.plan.planner import make_plan
from reconcile.spec.loader import load_spec
from reconcile.vllm.catalogue import known_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = os.path.join(ROOT, "specs", "blackwell-2x5090.toml")


def test_packaged_config_is_the_fixture_with_real_field_values() -> None:
    known = known_model("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4")
    assert known is not None
    assert known["config"]["hybrid_override_pattern"].count("*") == 6
    assert known["hf_quant_config"]["quantization"]["kv_cache_quant_algo"] == "FP8"
    assert known_model("someone/unknown-model") is None


@pytest.mark.skipif(
    os.path.exists("/root/models/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4"),
    reason="the model is really there: the plan reads it instead",
)
def test_reference_plan_shows_the_article_memory_math_before_download() -> None:
    plan = make_plan(load_spec(REFERENCE))
    fit = [f for f in plan.findings if f.rule == "memory.fit"]
    assert fit and fit[0].severity == "info", plan.findings
    # prefix caching on: vLLM 0.26 keeps NemotronH Mamba state per block ("all"), see test_preflight.py
    assert "7.52 GiB/GPU at 1,048,576 tokens (fp8)" in fit[0].message
    assert "= 1,536 B" in fit[0].evidence["table"]
