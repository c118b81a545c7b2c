"""Issue 24's ninth hostile round (classes 4-6) on the lab with real vLLM 0.26.0: the premise of the
server-row attack in tests/test_hostile_reader9b.py (while the model loads, the port is bound with
SO_REUSEADDR but not listened on, so another user can listen there first) checked against the real
server (tests/test_fake_vllm.py holds the fake to it), and the plan's row of a real healthy server
unchanged by the fix (still `healthy on ..., vLLM 0.26.0`, no foreign holder named).

Skipped unless RECONCILE_GPU_LAB=1. Run alone on the lab machine by
`GPU_LAB_TESTS=tests/test_gpu_lab_hostile9b.py tools/gpu_lab.sh` (about 2-3 minutes: one start of the
tiny model, watched). Figures are printed and written to $OUT/gpu-lab-hostile9b.json when $OUT is set:
seconds from the launch to the port's first accepted connection and to /health's first 200, and
whether a bind of the port, plain and with SO_REUSEADDR, succeeded while the engine loaded.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.test_fake_vllm import binds
from tests.test_gpu_lab import GPU_LAB_MARKS, LAB, ROOT, SPEC, cli, dump_figures, get, plan_json, variant

pytestmark = GPU_LAB_MARKS  # gpu, and skipped without RECONCILE_GPU_LAB=1 (tests/test_gpu_lab.py)

FIGURES: dict[str, Any] = {}
PORT = 8000


@pytest.fixture(scope="module", autouse=True)
def figures() -> Iterator[None]:
    yield
    dump_figures(FIGURES, "gpu-lab-hostile9b.json")


def _accepts() -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", PORT)) == 0


def test_real_vllm_leaves_its_port_free_while_the_model_loads() -> None:
    stop = variant("hostile9b-stop", {'\nname = "tiny"': '\nname = "tiny"\nrunning = false'})
    assert cli("apply", "--spec", stop)[0] in (0, 2)
    site = os.environ.get("RECONCILE_SITE", "")
    boot = (
        f"import sys; sys.path[:0] = [p for p in ({site!r}, {str(ROOT)!r}) if p]; "
        "from reconcile.cli import main; sys.exit(main())"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    apply = subprocess.Popen(
        [sys.executable, "-c", boot, "apply", "--spec", str(SPEC)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=ROOT,
    )
    log = LAB / "tiny.log"
    size = log.stat().st_size if log.exists() else 0
    started = time.monotonic()
    first_accept = first_health = None
    free_while_loading: bool | None = None
    try:
        while time.monotonic() - started < 200 and first_health is None:
            now = round(time.monotonic() - started, 2)
            if first_accept is None and _accepts():
                first_accept = now
            if first_accept is None and free_while_loading is None:
                text = log.read_text(errors="replace")[size:] if log.exists() else ""
                if "Loading weights took" in text or "Model loading took" in text:
                    # once, mid-start: the engine is up, the API not yet
                    free_while_loading = {
                        "plain": binds(PORT, reuse=False),
                        "reuseaddr": binds(PORT, reuse=True),
                    }
            if first_accept is not None:
                try:
                    if get("/health", with_key=False)[0] == 200:
                        first_health = now
                except OSError:
                    pass
            time.sleep(0.1)
        out, _ = apply.communicate(timeout=600)
    finally:
        if apply.poll() is None:
            apply.kill()
    print(out[-4000:])
    FIGURES.update(
        first_accept_s=first_accept, first_health_s=first_health, port_free_while_loading=free_while_loading
    )
    assert apply.returncode in (0, 2), out[-4000:]
    assert first_accept is not None and first_health is not None
    # The premise, from vLLM 0.26.0's api_server.setup_server (and the fake since round 9): the port is
    # bound with SO_REUSEADDR before the engine is built and listened on only after it, so while the model
    # loads a plain bind fails but one with SO_REUSEADDR succeeds: another user can listen there first,
    # and the plan's row must not take that user's answers as the server's.
    assert free_while_loading == {"plain": False, "reuseaddr": True}, free_while_loading
    data = plan_json(str(SPEC))
    rows = [r for r in data.get("resources") or [] if r.get("resource") == "server"]
    FIGURES["server_row"] = rows[0].get("summary") if rows else None
    assert rows and rows[0].get("status") == "ok", rows
    assert "healthy on" in rows[0]["summary"] and "held by" not in rows[0]["summary"], rows
