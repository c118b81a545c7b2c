"""The store by default on the H200 lab machine with real vLLM 0.26.0 (issue 26, items 1-2). Skipped
unless RECONCILE_GPU_LAB=1.

The lab spec with no store line (only its venv path and model source moved, so that the lab's other
tests' venv and source stay as they are): A, then B (another config.json patch: another model
realization over the same blobs), then B' (a file of the local source edited), then `rollback 1`
(the lab has no network; nothing is built or copied): A's venv and A's model bytes (sha256 of every file under
`[model] dir`), held. Each switch is timed, with its server step from the apply journal and its
phases (reconcile.apply.phases: start, load, plan, changes, final plan, judge, record ...); `du` of
the model realizations. Figures in $OUT/gpu-lab-store.json. Before the timed `rollback 1`, a
`rollback 2` runs under cProfile (its phases inflated by the profiler, so not the figure): the
profile in $OUT/rollback.prof, its top 25 entries (cumulative, then own time) in
$OUT/rollback-profile.txt, and the seconds the interpreter spent compiling source (the lab's image
sets PYTHONDONTWRITEBYTECODE=1 and tools/gpu_lab.sh installs reconcile's libraries --no-compile).

    GPU_LAB_TESTS=tests/test_gpu_lab_store.py tools/gpu_lab.sh
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from probes.health import ANSWER_TOKENS
from tests.test_gpu_lab import GPU_LAB_MARKS, LAB, ROOT, cli, get, key, starts_in_log, variant

pytestmark = GPU_LAB_MARKS  # gpu, and skipped without RECONCILE_GPU_LAB=1 (tests/test_gpu_lab.py)

FIGURES: dict[str, Any] = {}
SOURCE = LAB / "tiny-llama-src-store"
MOVED = {
    'path = "/opt/reconcile-lab/venv"': 'path = "/opt/reconcile-lab/venv-default-store"',
    'source = "/opt/reconcile-lab/tiny-llama-src"': f'source = "{SOURCE}"',
}
B = {"factor = 2.0": "factor = 4.0"}


def spec(name: str, extra: dict[str, str] | None = None) -> str:
    return variant(f"store-{name}", {**MOVED, **(extra or {})})


def model_bytes() -> dict[str, str]:
    root = os.path.realpath(LAB / "models" / "tiny-llama")
    out = {}
    for directory, _dirs, names in os.walk(root):
        for name in names:
            path = Path(directory) / name
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def du(*paths: Path, apart: bool = False) -> float:
    argv = ["du", "-s", "-B1", *(["-l"] if apart else []), *map(str, paths)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return round(sum(int(line.split()[0]) for line in out.splitlines()) / 2**20, 1)


def journal() -> dict[str, Any]:
    """The newest apply journal entry (what the last apply or rollback ran)."""
    where = LAB / "state" / "generations"
    newest = max((p for p in where.glob("*.json") if p.stem.isdigit()), key=lambda p: int(p.stem))
    data: dict[str, Any] = json.loads(newest.read_text())
    return data


def server_step() -> float:
    changes = journal()["changes"]
    return round(sum(float(c["seconds"]) for c in changes if c["resource"].endswith("server")), 2)


def timed(label: str, *args: str, expect: int) -> str:
    code, out, err, took = cli(*args)
    assert code == expect, out + err
    step = server_step()
    FIGURES[label] = {
        "seconds": round(took, 2),
        "server_step_s": step,
        "own_s": round(took - step, 2),
        "phases": journal().get("phases"),
    }
    return out


def profiled(label: str, *args: str, expect: int) -> None:
    """The CLI under cProfile (`python -m cProfile -o rollback.prof`, with the lab's cli() boot):
    the profile and its top entries in $OUT, the compile time, the phases."""
    import pstats
    import time

    out_dir = Path(os.environ.get("OUT") or LAB)
    prof = out_dir / "rollback.prof"
    boot = LAB / "reconcile-boot.py"
    site = os.environ.get("RECONCILE_SITE", "")
    boot.write_text(
        f"import sys\nsys.path[:0] = [p for p in ({site!r}, {str(ROOT)!r}) if p]\n"
        "from reconcile.cli import main\nsys.exit(main())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    argv = [sys.executable, "-m", "cProfile", "-o", str(prof), str(boot), *args]
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    took = time.monotonic() - started
    print(f"\n$ {' '.join(argv)}  -> exit {proc.returncode} in {took:.2f}s\n{proc.stdout[-3000:]}")
    assert proc.returncode in (0, expect), proc.stdout + proc.stderr  # cProfile may drop the exit code
    text = io.StringIO()
    stats = pstats.Stats(str(prof), stream=text)
    stats.sort_stats("cumulative").print_stats(25)
    stats.sort_stats("tottime").print_stats(25)
    (out_dir / "rollback-profile.txt").write_text(text.getvalue())
    rows = stats.stats.items()  # type: ignore[attr-defined]  # (file, line, name) -> (cc, nc, tt, ct, callers)
    compiled = sum(row[3] for func, row in rows if func[2] == "<built-in method builtins.compile>")
    step = server_step()
    FIGURES[label] = {
        "seconds": round(took, 2),
        "server_step_s": step,
        "own_s": round(took - step, 2),
        "compile_s": round(compiled, 2),
        "phases": journal().get("phases"),
    }


def acceptance_chat(max_tokens: int) -> dict[str, Any]:
    """The acceptance check's chat as the switch's `judge` phase sends it (probes.health.chat_check:
    the smoke prompt, temperature 0; max_tokens 16 now, half of max-model-len 1024 before), timed:
    how much of the judge phase is the random-weights model generating its tokens."""
    import http.client
    import time

    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "In one sentence, what is the capital of France?"}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    conn = http.client.HTTPConnection("127.0.0.1", 8000, timeout=120)
    started = time.monotonic()
    conn.request(
        "POST",
        "/v1/chat/completions",
        json.dumps(body),
        {"Authorization": f"Bearer {key()}", "Content-Type": "application/json"},
    )
    resp = conn.getresponse()
    data = json.loads(resp.read() or b"null")
    took = time.monotonic() - started
    usage = (data or {}).get("usage") or {}
    return {
        "status": resp.status,
        "seconds": round(took, 2),
        "completion_tokens": usage.get("completion_tokens"),
    }


@pytest.fixture(scope="module", autouse=True)
def figures() -> Iterator[None]:
    for sub in ("state/store", "state/profile", "venv-default-store", "models/tiny-llama"):
        path = LAB / sub
        if path.is_symlink():
            path.unlink()
        else:
            shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(SOURCE, ignore_errors=True)
    shutil.copytree(LAB / "tiny-llama-src", SOURCE)
    yield
    print("\nFIGURES " + json.dumps(FIGURES, indent=2))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu-lab-store.json").write_text(json.dumps(FIGURES, indent=2))
    cli("apply", "--spec", spec("stop", {'\nname = "tiny"': '\nname = "tiny"\nrunning = false'}))


def test_a_b_b_prime_then_rollback_restores_a_venv_and_model_bytes_offline() -> None:
    timed("a_apply", "apply", "--spec", spec("a"), expect=2)
    store = LAB / "state" / "store"
    (venv_a,) = store.glob("*-venv")
    (model_a,) = store.glob("*-model")
    assert os.readlink(LAB / "models" / "tiny-llama") == str(model_a)
    a_bytes = model_bytes()
    assert get("/v1/models")[0] == 200

    timed("b_apply", "apply", "--spec", spec("b", B), expect=2)
    assert len(list(store.glob("*-model"))) == 2 and list(store.glob("*-venv")) == [venv_a]
    tok = SOURCE / "tokenizer_config.json"
    text = tok.read_text()
    tok.write_text(text.replace("true", "TRUE", 1) if "true" in text else text + " ")
    timed("b_prime_apply", "apply", "--spec", spec("b", B), expect=2)
    models = sorted(store.glob("*-model"))
    assert len(models) == 3
    du = subprocess.run(
        ["du", "-s", "-B1", *map(str, models), str(store / "hub")], capture_output=True, text=True
    )
    du_apart = subprocess.run(["du", "-s", "-l", "-B1", *map(str, models)], capture_output=True, text=True)
    FIGURES["du_models_together_MiB"] = round(
        sum(int(x.split()[0]) for x in du.stdout.splitlines()) / 2**20, 1
    )
    FIGURES["du_models_apart_MiB"] = round(
        sum(int(x.split()[0]) for x in du_apart.stdout.splitlines()) / 2**20, 1
    )

    profiled("rollback_to_b_profiled", "rollback", "2", "--spec", spec("b", B), expect=2)
    starts = starts_in_log()
    out = timed("rollback_to_a", "rollback", "1", "--spec", spec("b", B), expect=2)
    assert "rolled back to generation 1" in out and "  phases: start " in out
    assert starts_in_log() == starts + 1
    assert os.readlink(LAB / "models" / "tiny-llama") == str(model_a) and model_bytes() == a_bytes
    assert os.readlink(LAB / "venv-default-store") == str(venv_a)
    assert get("/v1/models")[0] == 200
    FIGURES["acceptance_chat"] = acceptance_chat(ANSWER_TOKENS)
    FIGURES["acceptance_chat_before"] = acceptance_chat(512)  # the budget before issue 26's cut
    code, out, _err, _took = cli("apply", "--scheduled", "--spec", spec("b", B))
    assert code == 0 and starts_in_log() == starts + 1, out
    code, out, _err, _took = cli("gc", "--keep", "0", "--spec", spec("b", B))
    assert code == 0 and model_a.is_dir() and venv_a.is_dir(), out
    FIGURES["gc"] = out
