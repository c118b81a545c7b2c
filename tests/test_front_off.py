"""Taking [front] away: a spec (or a generation) without [front] for a deployment our HAProxy serves
converges in one apply: the colors drain and stop, our HAProxy stops, the plain server serves on the
public port. With real parts: apt's haproxy, the fake vLLM on the demo spec."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import tomlkit

from actions.supervising import marked_pids
from reconcile.host import http_request
from reconcile.identity import COLORS, color_spec
from reconcile.ownership.membership import front_master, scope_of
from reconcile.spec.loader import load_spec
from tests.apply_support import Demo
from tests.switch_load_support import Load, stop_front
from tests.test_deployments import Multi
from tests.test_fake_vllm_stop import refused
from tests.test_front_deployments import _color_pid, _views, fronted, fronted_spec
from tests.test_server_support import free_port, wait_for

__all__ = ["fronted"]  # the fixture, shared with tests/test_front_deployments.py

pytestmark = pytest.mark.skipif(shutil.which("haproxy") is None, reason="needs apt's haproxy (.ci/run)")


def _edit(doc: Any, ports: list[int] | None, running: bool = True) -> None:
    doc["server"]["args"]["gpu-memory-utilization"] = 0.4
    doc["server"]["running"] = running
    if ports is not None:
        doc["front"] = tomlkit.table()
        doc["front"]["ports"] = ports


def _fronted(demo: Demo, ports: list[int]) -> tuple[Any, int]:
    """Apply the spec with [front]; (its loaded spec, our HAProxy master's pid)."""
    demo.write_spec(lambda doc: _edit(doc, ports))
    first = demo.cli("apply")
    assert first.returncode == 2 and "started haproxy" in first.output, first.output
    spec = load_spec(str(demo.spec_path)).spec
    master = front_master(spec)
    assert master is not None
    return spec, master


def _gone(pid: int) -> bool:
    try:
        return "haproxy" not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return True


def _no_color(fronted: Any) -> bool:
    return not any(marked_pids(scope_of(color_spec(fronted, c))) for c in COLORS)


def _models(demo: Demo) -> Any:
    key = demo.key_file.read_text().strip()
    headers = {"Authorization": f"Bearer {key}"}
    return http_request("GET", "127.0.0.1", demo.port, "/v1/models", headers=headers)


def _served_plain(demo: Demo) -> bool:
    """/v1/models answers on the public port, from the deployment's own (front-less) server."""
    plain = load_spec(str(demo.spec_path)).spec
    return _models(demo).status == 200 and bool(marked_pids(scope_of(plain)))


def _teardown(demo: Demo, fronted: Any) -> None:
    for c in COLORS:
        from actions.supervising import stop_marked

        stop_marked(scope_of(color_spec(fronted, c)), timeout=5.0)
    master = front_master(fronted)
    if master is not None:
        import os
        import signal

        os.kill(master, signal.SIGTERM)
    stop_front(str(demo.spec_path))


def test_a_spec_without_front_takes_our_haproxy_away_and_serves_on_the_port_in_one_apply(demo: Demo) -> None:
    fronted: Any = None
    try:
        fronted, master = _fronted(demo, [free_port(), free_port()])
        demo.write_spec(lambda doc: _edit(doc, None))
        plan = demo.cli("plan")
        assert plan.returncode == 2, plan.output
        assert f"stop haproxy (pid {master})" in plan.output, plan.output
        assert "held by" not in plan.output, plan.output  # our own HAProxy is not a stranger on the port
        applied = demo.cli("apply")
        assert applied.returncode == 2, applied.output
        assert _gone(master) and front_master(fronted) is None
        assert _no_color(fronted)
        assert _served_plain(demo)
        again = demo.cli("plan")
        assert again.returncode == 0, again.output
    finally:
        if fronted is not None:
            _teardown(demo, fronted)


def test_running_false_without_front_stops_our_haproxy_and_every_color(demo: Demo) -> None:
    fronted: Any = None
    try:
        fronted, master = _fronted(demo, [free_port(), free_port()])
        demo.write_spec(lambda doc: _edit(doc, None, running=False))
        applied = demo.cli("apply")
        assert applied.returncode == 2, applied.output
        assert f"stopped haproxy (master pid {master})" in applied.output, applied.output
        assert _gone(master) and _no_color(fronted) and refused(demo.port)
        assert demo.cli("plan").returncode == 0
    finally:
        if fronted is not None:
            _teardown(demo, fronted)


def test_a_rollback_to_a_front_less_generation_converges_in_one_go(demo: Demo) -> None:
    fronted: Any = None
    try:
        demo.write_spec(lambda doc: _edit(doc, None))
        first = demo.cli("apply")
        assert first.returncode == 2, first.output
        fronted, master = _fronted(demo, [free_port(), free_port()])  # generation 2, behind HAProxy
        back = demo.cli("rollback", "1")
        assert back.returncode in (0, 2), back.output
        assert _gone(master) and front_master(fronted) is None, back.output
        assert _no_color(fronted)
        answer = _models(demo)
        assert answer.status == 200 and json.loads(answer.body)["data"], answer
        assert _served_plain(demo)
    finally:
        if fronted is not None:
            _teardown(demo, fronted)


def _without_chat_front(colors: dict[str, list[int]]) -> Any:
    def edit(doc: Any) -> None:
        fronted_spec(colors, 0.3)(doc)
        del doc["deployments"]["chat"]["front"]

    return edit


def test_taking_one_deployments_front_away_leaves_the_others_traffic_and_the_master(
    fronted: tuple[Multi, dict[str, Any]],
) -> None:
    """[deployments.chat.front] taken out: chat's frontend and backend leave the machine's HAProxy (a
    graceful reload), chat's colors stop and its own server serves its port; draft's traffic carries on
    through the same master, its server untouched."""
    multi, colors = fronted
    multi.write(fronted_spec(colors, 0.3))
    first = multi.cli("apply", "--auto-approve")
    assert first.returncode == 2, first.stdout + first.stderr
    views = _views(multi)
    master = front_master(views["draft"])
    assert master is not None
    draft_pid = _color_pid(multi, "draft", "blue")
    with Load(multi.ports["draft"], multi.key("draft"), "draft", clients=4) as draft:
        wait_for(lambda: draft.tally("before").ok >= 4, 60, "draft's load before")
        draft.phase = "take away"
        multi.write(_without_chat_front(colors))
        plan = multi.cli("plan")
        assert plan.returncode == 2 and "held by" not in plan.stdout, plan.stdout + plan.stderr
        assert f"take chat out of the machine's haproxy (pid {master})" in plan.stdout, plan.stdout
        applied = multi.cli("apply", "--auto-approve")
        draft.phase = "after"
        wait_for(lambda: draft.tally("after").ok >= 4, 60, "draft served on")
    assert applied.returncode == 2, applied.stdout + applied.stderr
    s = draft.summary()
    assert s["failed"] == 0 and s["cut"] == 0 and s["unserved"] == 0, s
    assert front_master(_views(multi)["draft"]) == master  # the same master: a reload, not a restart
    assert _color_pid(multi, "draft", "blue") == draft_pid
    config = (multi.state_dir / "front.cfg").read_text()
    assert "frontend chat" not in config and "vllm-chat" not in config and "frontend draft" in config
    assert _no_color(views["chat"])
    chat = _views(multi)["chat"]
    assert chat.front is None and marked_pids(scope_of(chat))  # its own server, on its public port
    assert multi.models("chat", multi.key("chat"))[0] == 200
    again = multi.cli("plan")
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_stranger_on_the_port_is_still_refused_though_a_pidfile_names_it_as_our_front(demo: Demo) -> None:
    """A process of nobody's holds the public port and our front pidfile names it, its command line even
    naming our config: not our HAProxy, so the preflight still refuses and nothing is signalled."""
    import subprocess

    demo.write_spec(lambda doc: _edit(doc, None))
    demo.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    config = demo.state_dir / f"front-{demo.name}.cfg"
    code = f"import socket,time;s=socket.socket();s.bind(('127.0.0.1',{demo.port}));s.listen();time.sleep(60)"
    stranger = subprocess.Popen(
        ["python3", "-c", code, str(config)], user="nobody", group="nogroup", start_new_session=True
    )
    try:
        (demo.state_dir / f"front-{demo.name}.pid").write_text(f"{stranger.pid}\n")
        wait_for(lambda: not refused(demo.port), 10, "the stranger listening")
        plan = demo.cli("plan")
        assert plan.returncode == 1 and f"port {demo.port} is held by" in plan.output, plan.output
        assert "stop haproxy" not in plan.output
        assert stranger.poll() is None  # never signalled
    finally:
        stranger.kill()
        stranger.wait()
