"""Liveness beyond /health, on the CPU demo: the fake vLLM's `VLLM::EngineCore` child stopped with SIGSTOP
(as seen on vLLM 0.26.0 on the H200: /health still 200, completions hang) is restarted by the next
scheduled apply; a busy engine that still makes tokens is left alone; the crash-loop guard counts hangs.

Real parts: the `reconcile` CLI, the fake vLLM's process tree, real signals, HTTP on loopback. The
engine is found as a child of the server the pidfile names, among the deployment's own processes
(its cgroup or recorded launches), never by its name alone.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconcile.host import HttpUnreachable, http_request
from reconcile.liveness import EngineSample, Stall, judge, keep_stall, read_stall, state_path
from tests.apply_support import Demo, demo_in, seed_venv
from tests.test_server_support import alive, generated_tokens, wait_for


def _liveness(**knobs: Any) -> Any:
    def edit(doc: Any) -> None:
        import tomlkit

        table = tomlkit.table()
        for key, value in knobs.items():
            table[key] = value
        doc["server"]["liveness"] = table

    return edit


@pytest.fixture
def live(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """A seeded demo whose liveness look is short: a 2 s deadline, a 1 s window (one look decides)."""
    for demo in demo_in(tmp_path, seed_venv(tmp_path_factory.getbasetemp(), {"ninja": "*"})):
        demo.write_spec(_liveness(deadline="2s", window="1s"))
        yield demo


def server_pid(demo: Demo) -> int:
    return int(demo.pidfile.read_text().split()[0])


def engine_core(demo: Demo) -> int:
    """The server's EngineCore: a deployment process (cgroup or recorded launch) whose parent is the
    pidfile's server and whose title is vLLM's."""
    server = server_pid(demo)
    found = []
    for pid in demo.server_pids():
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == server and comm.startswith("VLLM::EngineCor"):
            found.append(pid)
    assert len(found) == 1, f"the server {server}'s EngineCore among {demo.server_pids()}: {found}"
    return found[0]


def proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0].decode()


def stop(pid: int) -> None:
    """SIGSTOP, and wait until the kernel shows the process stopped."""
    os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: proc_state(pid) == "T", 10, f"pid {pid} stopped")


def health(demo: Demo) -> int:
    return http_request("GET", "127.0.0.1", demo.port, "/health", timeout=5).status


def chat(demo: Demo, body: dict[str, Any], timeout: float = 10) -> dict[str, Any]:
    key = demo.key_file.read_text().strip()
    resp = http_request(
        "POST",
        "127.0.0.1",
        demo.port,
        "/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        body=json.dumps({"model": demo.name, **body}).encode(),
        timeout=timeout,
    )
    assert resp.status == 200, resp.body[:300]
    data = resp.json()
    assert isinstance(data, dict)
    return data


def generated(demo: Demo) -> float:
    return generated_tokens(demo.port)


def hangs_forever(demo: Demo) -> bool:
    """A 1-token completion gets no answer in 2 s (what the H200 showed with a stopped EngineCore)."""
    try:
        chat(demo, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}, timeout=2)
    except HttpUnreachable:
        return True
    return False


def test_a_stopped_engine_core_is_restarted_by_the_next_scheduled_apply(live: Demo) -> None:
    first = live.cli("apply")
    assert first.returncode == 2, first.output
    old_server, old_engine = server_pid(live), engine_core(live)
    assert live.cli("plan").returncode == 0  # a live engine: no drift

    stop(old_engine)
    assert [health(live) for _ in range(5)] == [200] * 5  # what /health alone would say
    assert hangs_forever(live)

    plan = live.cli("plan")
    assert plan.returncode == 2, plan.output
    assert re.search(
        r"± server\s+restart .*engine hung since \d\d:\d\d:\d\d \(no tokens for \d+s", plan.stdout
    )
    assert "a 1-token completion got no answer in 2s" in plan.stdout
    assert not (live.state_dir / f"liveness-{live.name}.json").exists()  # plan writes nothing

    status = live.cli("status")
    assert status.returncode == 2, status.output
    assert re.search(r"✗ engine: hung since \d\d:\d\d:\d\d \(no tokens for", status.stdout), status.stdout

    applied = live.cli("apply", "--scheduled")
    assert applied.returncode == 2, applied.output
    restarted = r"server\s+changed: (prepared in [\d.]+s, then )?started .*why: engine hung since"
    assert re.search(restarted, applied.stdout), applied.stdout
    # A hung engine finishes nothing: its stop does not wait out the drain (--shutdown-timeout 20 of
    # stop_timeout 30; before, the old one took 22 s to stop).
    stopped_in = re.search(r"the old one stopped in ([\d.]+)s", applied.stdout)
    assert stopped_in is not None and float(stopped_in.group(1)) < 15, applied.stdout
    assert "Apply converged" in applied.stdout

    new_server = server_pid(live)
    assert new_server != old_server and not alive(old_server) and not alive(old_engine)
    assert proc_state(engine_core(live)) in ("S", "R")
    answer = chat(live, {"messages": [{"role": "user", "content": "the capital of France?"}]})
    assert answer["choices"][0]["message"]["content"] == "The capital of France is Paris."
    assert health(live) == 200

    record = json.loads(live.last_run.read_text())
    assert record["scheduled"] is True and record["exit_code"] == 2
    (server,) = [r for r in record["results"] if r["resource"] == "server"]
    assert server["result"] == "changed" and "engine hung since" in server["message"]
    history = json.loads((live.state_dir / f"server-{live.name}.json").read_text())["history"]
    assert [h["outcome"] for h in history] == ["ok", "hung", "ok"]
    assert history[1]["pid"] == old_server and history[1]["reason"].startswith("engine hung since")

    again = live.cli("apply", "--scheduled")
    assert again.returncode == 0, again.output
    assert server_pid(live) == new_server


def test_the_window_spans_scheduled_applies(live: Demo) -> None:
    """A window longer than one look: the first scheduled apply keeps the stall (0600), the one after
    the window restarts, timing the stall from the first look."""
    live.write_spec(_liveness(deadline="1s", window="6s"))
    assert live.cli("apply").returncode == 2
    old_server = server_pid(live)
    stop(engine_core(live))

    first = live.cli("apply", "--scheduled")
    assert first.returncode == 0, first.output
    assert server_pid(live) == old_server
    kept = live.state_dir / f"liveness-{live.name}.json"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    stall = json.loads(kept.read_text())["stall"]
    assert stall["pid"] == old_server
    since = stall["since"]
    plan = live.cli("plan")
    assert plan.returncode == 0, plan.output
    assert re.search(r"engine stalled since .* restarted once stalled for 6s", plan.stdout), plan.stdout

    wait_for(lambda: time.time() > since + 6.5, 20, "the window to pass")
    second = live.cli("apply", "--scheduled")
    assert second.returncode == 2, second.output
    clock = time.strftime("%H:%M:%S", time.localtime(since))
    assert f"engine hung since {clock}" in second.stdout
    assert server_pid(live) != old_server
    third = live.cli("apply", "--scheduled")  # the new server answers: the stall is over
    assert third.returncode == 0, third.output
    assert json.loads(kept.read_text())["stall"] is None


def test_a_busy_engine_that_still_makes_tokens_is_not_restarted(live: Demo) -> None:
    """One sequence at a time and a long generation ahead: the 1-token completion waits past its
    deadline, but tokens move, so the engine is busy, not hung."""

    def slow(doc: Any) -> None:
        _liveness(deadline="1s", window="1s")(doc)
        doc["server"]["args"]["max-num-seqs"] = 1
        doc["server"]["env"]["FAKE_VLLM_TOKEN_S"] = "0.05"

    live.write_spec(slow)
    assert live.cli("apply").returncode == 2
    server = server_pid(live)
    done = threading.Event()
    body = {"messages": [{"role": "user", "content": "talk"}], "max_tokens": 600, "ignore_eos": True}
    threading.Thread(target=lambda: (chat(live, body, timeout=120), done.set()), daemon=True).start()
    wait_for(lambda: generated(live) > 0, 10, "the long request to generate")

    applied = live.cli("apply", "--scheduled")
    assert not done.is_set(), "the long request ended before the apply looked: the test proves nothing"
    assert applied.returncode == 0, applied.output
    assert server_pid(live) == server and live.starts_in_log() == 1
    plan = live.cli("plan")
    assert not done.is_set()
    assert plan.returncode == 0, plan.output
    assert re.search(r"busy: \d+ tokens generated while a 1-token completion waited", plan.stdout), (
        plan.stdout
    )
    assert done.wait(60)


def test_the_crash_loop_guard_holds_an_engine_that_keeps_hanging(live: Demo) -> None:
    def guarded(doc: Any) -> None:
        _liveness(deadline="1s", window="1s")(doc)
        doc["server"]["crash_loop"] = {"max_starts": 1, "window": "10m"}

    live.write_spec(guarded)
    assert live.cli("apply").returncode == 2
    first = server_pid(live)
    stop(engine_core(live))
    restarted = live.cli("apply", "--scheduled")
    assert restarted.returncode == 2, restarted.output
    second = server_pid(live)
    assert second != first

    stuck = engine_core(live)
    stop(stuck)
    held = live.cli("apply", "--scheduled")
    assert held.returncode == 4, held.output
    assert "was restarted with its engine hung 1 times within 600s" in held.stdout
    assert "not starting it again before" in held.stdout
    assert server_pid(live) == second and proc_state(stuck) == "T"  # left as it was, not stopped
    status = live.cli("status")
    assert "was restarted with its engine hung" in status.stdout

    reset = live.cli("apply", "--scheduled", "--reset-crash-loop")
    assert "forgot 1 hung engine(s)" in reset.stderr, reset.output
    assert reset.returncode == 2, reset.output
    assert server_pid(live) not in (first, second)


# --- the verdict (reconcile.liveness.judge) and the kept stall, without a server ------------------------


def sample(
    answered: bool | None, before: float | None, after: float | None, prior: Stall | None = None
) -> Any:
    return EngineSample(1000.0, answered, 2.0, 2.0, before, after, 1.0, 3.0, prior=prior)


def test_an_answer_is_alive_and_ends_a_stall() -> None:
    verdict = judge(sample(True, None, None, Stall(7, 5.0, 900.0, 10.0)), 7, 5.0, window=60)
    assert verdict.state == "alive" and verdict.stall is None


def test_tokens_that_move_while_the_completion_waits_are_busy_not_hung() -> None:
    verdict = judge(sample(False, 10.0, 25.0, Stall(7, 5.0, 100.0, 10.0)), 7, 5.0, window=1)
    assert verdict.state == "busy" and verdict.stall is None
    assert verdict.message.startswith("busy: 15 tokens generated while a 1-token completion waited 2s")


def test_a_stall_is_timed_from_the_first_look_of_the_same_server_at_the_same_count() -> None:
    first = judge(sample(False, 10.0, 10.0), 7, 5.0, window=60)
    assert first.state == "stalled" and first.stall == Stall(7, 5.0, 1000.0, 10.0, 1.0, 3.0)
    later = EngineSample(1100.0, False, 2.0, 2.0, 10.0, 10.0, 1.0, 3.0, prior=first.stall)
    verdict = judge(later, 7, 5.0, window=60)
    assert verdict.state == "hung" and verdict.stall is not None and verdict.stall.since == 1000.0
    assert "no tokens for 102s with 1 running, 3 waiting by vLLM's /metrics" in verdict.message


def test_a_stall_kept_for_another_server_or_count_starts_again() -> None:
    kept = Stall(7, 5.0, 100.0, 10.0)
    for pid, start, count in ((8, 5.0, 10.0), (7, 99.0, 10.0), (7, 5.0, 11.0)):
        verdict = judge(sample(False, count, count, kept), pid, start, window=60)
        assert verdict.state == "stalled" and verdict.stall is not None and verdict.stall.since == 1000.0


def test_an_error_answer_says_nothing_about_progress() -> None:
    kept = Stall(7, 5.0, 100.0, 10.0)
    verdict = judge(
        EngineSample(1000.0, None, 0.1, 2.0, error="the 1-token completion answered HTTP 401", prior=kept),
        7,
        5.0,
        window=1,
    )
    assert verdict.state == "unknown" and verdict.stall == kept and "HTTP 401" in verdict.message


def test_the_kept_stall_is_private_and_a_damaged_one_is_moved_aside(tmp_path: Path) -> None:
    from reconcile.spec.loader import load_spec

    spec_file = tmp_path / "spec.toml"
    spec_file.write_text(
        f'[machine]\nstate_dir = "{tmp_path}/state"\n\n[server]\nname = "x"\nexecutable = "/bin/true"\n'
        f'model = "m"\nlog = "{tmp_path}/x.log"\n'
    )
    spec = load_spec(str(spec_file)).spec
    stall = Stall(7, 5.0, 100.0, 10.0, 1.0, 0.0)
    assert keep_stall(spec, stall, None) is True
    path = Path(state_path(spec))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert read_stall(spec) == stall
    assert keep_stall(spec, stall, stall) is False  # unchanged: not written again
    path.write_text('{"format": "reconcile-liveness/1", "stall": {"pid": "seven"}}')
    assert read_stall(spec) is None
    assert not path.exists() and len(list(path.parent.glob(path.name + ".corrupt-*"))) == 1


def test_a_stopped_member_ends_on_sigterm_without_waiting_for_sigkill() -> None:
    """stop_marked sends SIGCONT after SIGTERM (as systemd does): a SIGSTOPped EngineCore would
    otherwise hold the SIGTERM until the SIGKILL, a whole stop_timeout later."""
    import subprocess
    import sys
    import uuid

    from actions import supervising
    from reconcile.identity import MARKER

    marker = f"liveness-{uuid.uuid4().hex[:10]}@/nonexistent"
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"],
        env={**os.environ, MARKER: marker},
        start_new_session=True,
    )
    try:
        wait_for(lambda: proc.pid in supervising.marked_pids(marker), 10, "the marked process")
        stop(proc.pid)
        outcome = supervising.stop_marked(marker, timeout=60)
        assert outcome.terminated == (proc.pid,) and outcome.killed == (), outcome
        assert proc.wait(5) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a listener of another user)")
def test_the_liveness_look_sends_nothing_to_a_listener_of_another_user(
    tmp_path: Path, strangers: list[int]
) -> None:
    """A nobody listener on the deployment's port that answers anything with 200: the look neither sends
    it the key nor the completion (nor waits on it), and says whose the port is."""
    from probes import liveness
    from probes.common import Unavailable
    from reconcile.spec.loader import load_spec
    from tests.ownership_support import SPY, as_nobody, received

    for demo in demo_in(tmp_path):
        demo.key_file.parent.mkdir(parents=True, exist_ok=True)
        demo.key_file.write_text("sk-the-real-key\n")
        demo.key_file.chmod(0o600)
        spy = as_nobody(["/usr/bin/python3", "-c", SPY, str(demo.port)], {}, strangers)
        seen = liveness.probe(load_spec(str(demo.spec_path)).spec)
        got = received(spy)
        assert "sk-the-real-key" not in got and "authorization" not in got.lower()
        assert "POST" not in got and "GET /metrics" not in got
        assert isinstance(seen, Unavailable) and f"pid {spy.pid}" in seen.reason and "nobody" in seen.reason
