"""Issue 14's oracle on the GPU lab: vLLM 0.26.0's own figures against reconcile's engine.

Skipped unless RECONCILE_GPU_LAB=1 and vLLM imports (tools/preflight_oracle.sh sets both up). The
figures land in $OUT/preflight-oracle.* and $OUT/preflight-serve.* (see docs/preflight.md).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        os.environ.get("RECONCILE_GPU_LAB") != "1" or importlib.util.find_spec("vllm") is None,
        reason="needs the GPU lab with vLLM importable (RECONCILE_GPU_LAB=1)",
    ),
]

ROOT = Path(__file__).resolve().parent.parent


def _run(script: str, out: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OUT": str(out)}
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / script)], capture_output=True, text=True, env=env, timeout=1800
    )


def _out(tmp_path: Path) -> Path:
    out = Path(os.environ.get("OUT") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


def test_vllms_config_code_agrees_on_every_corpus_model(tmp_path: Path) -> None:
    out = _out(tmp_path)
    proc = _run("preflight_oracle.py", out)
    print(proc.stdout[-6000:], proc.stderr[-3000:])
    rows = json.loads((out / "preflight-oracle.json").read_text())["rows"]
    assert len(rows) >= 25
    bad = {r["name"]: r.get("diffs") or r.get("error") for r in rows if not r.get("agree")}
    assert not bad, bad
    # The reference spec's serving (prefix caching on: "all" mode) is in vLLM's own figures too.
    ref = next(r for r in rows if r["name"] == "reference-spec")
    assert ref["vllm"]["mamba_cache_mode"] == "all"


def test_served_capacity_and_verdicts_agree_with_vllm(tmp_path: Path) -> None:
    out = _out(tmp_path)
    proc = _run("preflight_serve_check.py", out)
    print(proc.stdout[-6000:], proc.stderr[-3000:])
    rows = json.loads((out / "preflight-serve.json").read_text())["rows"]
    assert len(rows) >= 9
    assert all(r["verdict_agrees"] for r in rows), [(r["name"], r["fits"], r["started"]) for r in rows]
    # The block size (an MLA model's follows its backend) and the Mamba cache mode vLLM logged.
    assert all(r["layout_agrees"] for r in rows), [
        (r["name"], r["logged_block_size"], r["block_size"], r["logged_mamba_mode"], r["mamba_mode"])
        for r in rows
    ]
    pc = next(r for r in rows if r["name"] == "mamba-hybrid-pc")  # the reference spec's "all" mode
    assert pc["logged_mamba_mode"] == "all" == pc["mamba_mode"]
    for r in rows:
        if r["started"]:
            assert abs(r["capacity_error_pct"]) <= 2.0, r
            # The block math alone, on vLLM's own "Available KV cache memory" (rounded to 0.01 GiB).
            assert abs(r["layout_tokens"] - r["logged_tokens"]) <= 0.002 * r["logged_tokens"], r
