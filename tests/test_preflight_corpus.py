"""Every rule on the 27 published configs of tests/data/model_configs, as a plan made before download
sees them (unset max-model-len, no weight files, H200s at the corpus's TP): nothing crashes, the
corpus's TP passes the head rules, and memory.fit never says a plain "fits" on estimated weights.
The weight estimate is checked against the models' published parameter counts."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from reconcile.preflight.context import GpuFact
from reconcile.preflight.gather import run_preflight
from reconcile.spec.models import Spec
from reconcile.vllm.memory import GiB
from reconcile.vllm.weights import parameters
from tests.test_preflight import BASE, GOOD, of

CORPUS = Path(__file__).resolve().parent / "data" / "model_configs"
NAMES = sorted(p.stem for p in CORPUS.glob("*.json"))
# Parameter counts from the model cards (language model only where the repo has a vision tower).
PUBLISHED_B = {"llama-3.1-8b": 8.03, "llama-3.1-70b-instruct": 70.6, "mistral-7b-instruct-v0.3": 7.25,
               "mixtral-8x7b-v0.1": 46.7, "qwen2.5-7b": 7.62, "qwen3-8b": 8.19, "qwen3-30b-a3b": 30.5,
               "gemma-2-9b": 9.24, "phi-4": 14.7, "deepseek-v2-lite-chat": 15.7, "deepseek-v3": 671.0,
               "gpt-oss-20b": 20.9, "gpt-oss-120b": 116.8, "jamba-1.5-mini": 51.6,
               "nemotron-3-nano-30b-a3b": 31.6}  # fmt: skip


def copied(record: Any, **changes: Any) -> Any:
    """A copy of a record with changes."""
    return record._replace(**changes)


def corpus(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CORPUS / f"{name}.json").read_text())
    return data


def plan_before_download(name: str) -> list[Any]:
    entry = corpus(name)
    tp = int(entry.get("tp", 1))
    data = copy.deepcopy(BASE)
    data["gpu"] = {"count": tp, "name": "NVIDIA H200", "compute_capability": "9.0"}
    data["model"] = {"repo": f"corpus/{name}", "dir": f"/models/{name}"}
    data["server"]["args"] = {"tensor-parallel-size": tp}
    h200s = tuple(GpuFact(i, "NVIDIA H200", "9.0", int(139.8 * GiB), int(139 * GiB)) for i in range(tp))
    inputs = copied(
        GOOD,
        gpus=h200s,
        model_config=entry["config"],
        hf_quant_config=entry.get("hf_quant_config"),
        model_file_sizes={},
        model_files=frozenset(),
    )
    return list(run_preflight(Spec.model_validate(data), inputs))


@pytest.mark.parametrize("name", NAMES)
def test_every_rule_runs_on_the_corpus_before_download(name: str) -> None:
    found = plan_before_download(name)
    for f in found:
        json.dumps({"rule": f.rule, "evidence": dict(f.evidence)})
    assert [f.message for f in of(found, "memory.tp") if f.severity == "error"] == []
    assert [f.message for f in found if f.rule.startswith("hardware.") and f.severity == "error"] == []
    (fit,) = of(found, "memory.fit")
    assert fit.severity != "info", fit.message  # the weights are an estimate: never a plain "fits"
    assert fit.evidence["weights_source"].startswith("estimated: ")
    assert "max-model-len unset: the derived length" in fit.message or "exceed the budget" in fit.message, (
        fit.message
    )


@pytest.mark.parametrize("name", sorted(PUBLISHED_B))
def test_the_weight_estimate_is_near_the_published_parameter_count(name: str) -> None:
    estimated = parameters(corpus(name)["config"])[0] / 1e9
    assert abs(estimated - PUBLISHED_B[name]) / PUBLISHED_B[name] < 0.03, estimated
