"""The closure lock on the H200 lab machine (issue 26, item 3). Skipped unless RECONCILE_GPU_LAB=1.

The lab spec's own [venv] (vLLM 0.26.0 and what it needs, from /opt/reconcile-lab/wheelhouse,
offline) in a spec of its own with a store: `reconcile lock` pins its closure with hashes, apply
realizes it from the lock (hash-checked), then the same spec without the lock into another store.
Times and sizes go to $OUT/gpu-lab-lock.json. Bounded to about 4 minutes (two vLLM venv installs).

    GPU_LAB_TESTS=tests/test_gpu_lab_lock.py tools/gpu_lab.sh

Needs uv: on PATH, or its wheel among $RECONCILE_WHEELS (it is a dependency of reconcile).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.test_gpu_lab import GPU_LAB_MARKS, LAB, SPEC, cli, dump_figures

pytestmark = GPU_LAB_MARKS

FIGURES: dict[str, Any] = {}
HERE = LAB / "lock-test"


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


def venv_spec(store: str) -> Path:
    """The lab spec's [venv], realized under `store`, and nothing else (no model, no server)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    venv = dict(tomllib.loads(SPEC.read_text())["venv"])
    venv["path"] = str(HERE / "venv")
    venv["store"] = str(HERE / store)
    body = "".join(f"{k} = {toml_value(v)}\n" for k, v in venv.items())
    path = HERE / "specs" / "lab-venv.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'[machine]\nstate_dir = "{HERE / "state"}"\n\n[venv]\n{body}')
    return path


def packages_seconds() -> float:
    journal = HERE / "state" / "generations"
    newest = max((p for p in journal.glob("*.json") if p.stem.isdigit()), key=lambda p: int(p.stem))
    changes = json.loads(newest.read_text())["changes"]
    return round(sum(float(c["seconds"]) for c in changes if c["resource"] == "venv.packages"), 1)


def test_lock_then_apply_from_the_lock_and_without_it() -> None:
    shutil.rmtree(HERE, ignore_errors=True)
    HERE.mkdir(parents=True)
    spec = venv_spec("store-locked")

    code, out, err, took = cli("lock", "--spec", str(spec))
    assert code == 2, out + err
    lock = json.loads(spec.with_suffix(".lock").read_text())
    closure = lock["closure"]["requirements"]
    FIGURES["lock"] = {
        "seconds": round(took, 1),
        "distributions": len(closure),
        "hashes": sum(line.count("--hash=") for line in closure),
        "lock_bytes": spec.with_suffix(".lock").stat().st_size,
        "python": lock["closure"]["python"],
        "platform": lock["closure"]["platform"],
        "resolver": lock.get("resolver"),
    }
    code, out, err, took = cli("lock", "--spec", str(spec))
    assert code == 0, out + err  # nothing moved
    FIGURES["lock_again_seconds"] = round(took, 1)

    code, out, err, took = cli("apply", "--spec", str(spec))
    assert code == 2, out + err
    assert "hashes checked" in out
    FIGURES["apply_from_lock"] = {"seconds": round(took, 1), "venv_packages_s": packages_seconds()}
    code, out, err, _ = cli("plan", "--spec", str(spec))
    assert code == 0, out + err

    spec.with_suffix(".lock").rename(HERE / "lab-venv.lock.aside")
    spec = venv_spec("store-unlocked")
    code, out, err, took = cli("apply", "--spec", str(spec))
    assert code == 2, out + err
    FIGURES["apply_without_lock"] = {"seconds": round(took, 1), "venv_packages_s": packages_seconds()}


@pytest.fixture(scope="module", autouse=True)
def figures() -> Any:
    yield
    dump_figures(FIGURES, "gpu-lab-lock.json")
    shutil.rmtree(HERE, ignore_errors=True)
