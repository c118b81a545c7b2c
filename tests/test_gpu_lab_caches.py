"""A cold start against a warm switch start on the H200 lab with real vLLM 0.26.0 (issue 30, "prepare
before stopping"). Skipped unless RECONCILE_GPU_LAB=1.

The server's caches live in <state_dir>/vllm-cache (actions/launching.py cache_root). With the
server stopped, that directory is moved aside (restored at the end): the next `reconcile apply`
is a cold start (torch.compile, Triton, FlashInfer and the CUDA JIT from nothing). Then a switch to
gpu-memory-utilization 0.31 (not in vLLM's compile hash) is a warm start from the cache the cold one
wrote. Both without the lab spec's enforce-eager, so that vLLM compiles (torch.compile, CUDA graphs).
Per start: apply's seconds and its "prepared in X s, down for Y s", vLLM's "torch.compile
takes", "init engine ... took", whether the compiled graph was loaded from the cache, and the cache's
size. Figures in $OUT/gpu-lab-caches.json, written after each start. Expected duration: about
3 minutes (a cold compiling start ~90 s, a warm switch ~60 s, two stops).

    GPU_LAB_TESTS=tests/test_gpu_lab_caches.py tools/gpu_lab.sh
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from tests.test_gpu_lab import GPU_LAB_MARKS, LAB, cli, variant

pytestmark = GPU_LAB_MARKS

FIGURES: dict[str, Any] = {}
UTIL = "gpu-memory-utilization = 0.3"
COMPILED = {"enforce-eager = true, ": ""}  # the lab spec runs eager; these starts compile, as a real one does
STOP = {'\nname = "tiny"': '\nname = "tiny"\nrunning = false'}
CACHE = LAB / "state" / "vllm-cache"


def _save() -> None:
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu-lab-caches.json").write_text(json.dumps(FIGURES, indent=2))


def _since_last_start(log: Path) -> str:
    text = log.read_text(errors="replace")
    at = text.rfind("--- reconcile ")
    return text[at:] if at >= 0 else text


def _size(root: Path) -> tuple[int, int]:
    files = [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    return len(files), sum(p.stat().st_size for p in files)


def _start(label: str, *args: str) -> dict[str, Any]:
    code, out, err, took = cli(*args)
    log = _since_last_start(LAB / "tiny.log")
    compile_s = re.search(r"torch\.compile takes ([\d.]+) s in total", log)
    init_s = re.search(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+)", log)
    said = re.search(r"prepared in [\d.]+s.*?down for [\d.]+s", out)
    files, size = _size(CACHE) if CACHE.is_dir() else (0, 0)
    FIGURES[label] = {
        "exit": code, "apply_s": round(took, 1), "apply_says": said.group(0) if said else None,
        "torch_compile_s": float(compile_s.group(1)) if compile_s else None,
        "init_engine_s": float(init_s.group(1)) if init_s else None,
        "loaded_from_cache": "Directly load" in log,  # backends.py:293, or decorators.py's AOT load
        "compiled": "Compiling a graph" in log,
        "cache_files": files, "cache_bytes": size, "error": (out + err)[-600:] if code not in (0, 2) else "",
    }  # fmt: skip
    _save()
    return FIGURES[label]


def test_a_switch_with_an_unchanged_compile_key_starts_warm_from_the_kept_cache() -> None:
    aside = CACHE.with_name(f"vllm-cache.aside-{int(time.time())}")
    cli("apply", "--spec", variant("caches-stop", STOP))
    if CACHE.exists():
        CACHE.rename(aside)
    try:
        cold = _start("cold", "apply", "--spec", variant("caches-a", COMPILED))
        assert cold["exit"] in (0, 2), cold
        b = variant("caches-b", {**COMPILED, UTIL: "gpu-memory-utilization = 0.31"})
        warm = _start("warm_switch", "apply", "--spec", b)
        assert warm["exit"] in (0, 2), warm
        FIGURES["saved_s"] = (
            round(cold["apply_s"] - warm["apply_s"], 1) if cold["apply_s"] and warm["apply_s"] else None
        )
        _save()
        assert not cold["loaded_from_cache"], f"cold start loaded a compiled graph from the empty {CACHE}"
        assert warm["loaded_from_cache"], (
            f"warm switch: no 'Directly load' in vLLM's log; torch.compile {warm['torch_compile_s']} s "
            f"against {cold['torch_compile_s']} s cold; cache {warm['cache_files']} files"
        )
    finally:
        print("\nFIGURES " + json.dumps(FIGURES, indent=2))
        cli("apply", "--spec", variant("caches-stop", STOP))
        if aside.exists():  # the lab's own cache back, the cold run's thrown away
            shutil.rmtree(CACHE, ignore_errors=True)
            aside.rename(CACHE)
