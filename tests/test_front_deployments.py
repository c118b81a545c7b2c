"""Blue/green per deployment behind the machine's one HAProxy ([deployments.<name>.front]), with real
parts: apt's haproxy (one config, one master), two fake vLLM deployments on one fake GPU, loads of
streamed chats through the public ports. A switch of one deployment moves only its traffic; the room
check counts both of its colors beside the other deployment's share; ports that collide across
deployments are refused by the plan with file:line:key."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomlkit

from actions import haproxy, supervising
from reconcile.errors import SpecError
from reconcile.identity import COLORS, active_color, color_spec, server_socket
from reconcile.ownership.membership import front_master, scope_of
from reconcile.spec.deployments import deployments
from reconcile.spec.loader import load_spec
from tests.apply_support import copy_venv, seed_venv
from tests.switch_load_support import Load
from tests.test_deployments import NAMES, Multi
from tests.test_server_support import free_port, wait_for

needs_haproxy = pytest.mark.skipif(shutil.which("haproxy") is None, reason="needs apt's haproxy (.ci/run)")


def fronted_spec(colors: dict[str, list[int]], share: float, seqs: int = 4) -> Any:
    def edit(doc: Any) -> None:
        for name in NAMES:
            table = doc["deployments"][name]
            table["server"]["args"]["gpu-memory-utilization"] = share
            table["server"]["env"]["FAKE_VLLM_TOKEN_S"] = "0.02"  # 150 tokens: 3 s per stream
            table["server"]["env"]["FAKE_VLLM_STARTUP_DELAY"] = "1.0"
            front = tomlkit.table()
            front["ports"] = colors[name]
            table["front"] = front
        doc["deployments"]["chat"]["server"]["args"]["max-num-seqs"] = seqs

    return edit


def _views(multi: Multi) -> dict[str, Any]:
    return {d.name: d.loaded.spec for d in deployments(load_spec(str(multi.spec_path)))}


def stop_all(multi: Multi) -> None:
    """Every deployment's servers (colors and the one from before the front), then the machine's
    HAProxy master (ours: pidfile, exe, config)."""
    try:
        views = _views(multi)
    except Exception:
        return
    for view in views.values():
        # Its server from before the front too: a test that started one and failed before moving it.
        supervising.stop_marked(scope_of(view.model_copy(update={"front": None})), timeout=5.0)
        if getattr(view, "front", None) is None:
            continue
        for color in COLORS:
            supervising.stop_marked(scope_of(color_spec(view, color)), timeout=5.0)
    for view in views.values():
        if getattr(view, "front", None) is not None and (pid := front_master(view)) is not None:
            os.kill(pid, signal.SIGTERM)
            break


def distinct_ports(count: int) -> list[int]:
    """`count` free loopback ports, all different (bound together, then let go)."""
    held = [socket.socket() for _ in range(count)]
    try:
        for s in held:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in held]
    finally:
        for s in held:
            s.close()


@pytest.fixture
def fronted(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Multi, dict[str, Any]]]:
    ports = distinct_ports(3 * len(NAMES))
    m = Multi(tmp_path, {name: ports.pop() for name in NAMES})
    colors = {name: [ports.pop(), ports.pop()] for name in NAMES}
    copy_venv(seed_venv(tmp_path_factory.getbasetemp(), {"ninja": "*"}), tmp_path / "venv")
    try:
        yield m, colors
    finally:
        stop_all(m)


def _stats(view: Any) -> dict[tuple[str, str], dict[str, str]]:
    """HAProxy's own counters (`show stat`): (backend, server) -> its row (status, stot: sessions)."""
    text = haproxy.runtime(view, "show stat").lstrip("# ")
    return {(r["pxname"], r["svname"]): r for r in csv.DictReader(io.StringIO(text)) if r.get("pxname")}


def _workers(master: int) -> list[int]:
    """The HAProxy master's children: its worker (a reload forks a new one)."""
    return sorted(int(p) for p in Path(f"/proc/{master}/task/{master}/children").read_text().split())


def _switch(multi: Multi) -> tuple[str, str]:
    """The plan's answer for chat's restart: the server row's `switch` diff (old -> new)."""
    plan = multi.cli("plan", "--deployment", "chat", "--json")
    rows = json.loads(plan.stdout)["deployments"]["chat"]["resources"]
    (server,) = [r for r in rows if r["resource"] == "server"]
    (diff,) = [d for d in server["diffs"] if d["field"] == "switch"]
    return diff["old"], diff["new"]


def _color_pid(multi: Multi, name: str, color: str) -> int:
    pidfile = multi.state_dir / "deployments" / name / f"{name}-{color}.pid"
    return int(pidfile.read_text().split()[0])


@needs_haproxy
def test_a_switch_of_one_deployment_behind_the_shared_front_moves_only_its_traffic(
    fronted: tuple[Multi, dict[str, Any]],
) -> None:
    multi, colors = fronted
    multi.write(fronted_spec(colors, 0.3))  # 0.3 x 2 (chat blue + green) + 0.3 (draft) = 0.9: room
    first = multi.cli("apply", "--auto-approve")
    assert first.returncode == 2, first.stdout + first.stderr
    views = _views(multi)
    master = front_master(views["chat"])
    assert master is not None and front_master(views["draft"]) == master  # one HAProxy for both
    config = (multi.state_dir / "front.cfg").read_text()
    assert (
        config.count("\nfrontend ") == 2 and "backend vllm-chat" in config and "backend vllm-draft" in config
    )
    assert not list(multi.state_dir.glob("deployments/*/front-*.cfg"))  # no HAProxy per deployment
    draft_pid = _color_pid(multi, "draft", "blue")
    workers = _workers(master)
    assert len(workers) == 1
    before = _stats(views["draft"])[("vllm-draft", "blue")]

    with (
        Load(multi.ports["chat"], multi.key("chat"), "chat", clients=4) as chat,
        Load(multi.ports["draft"], multi.key("draft"), "draft", clients=4) as draft,
    ):
        wait_for(lambda: chat.tally("before").ok >= 4 and draft.tally("before").ok >= 4, 60, "load before")
        chat.phase = draft.phase = "switch"
        multi.write(fronted_spec(colors, 0.3, seqs=5))
        assert _switch(multi) == (
            "drain-restart",
            "blue/green (GPU 0: gpu-memory-utilization 0.3 x 2 (chat blue + green) + 0.3 (draft) = 0.9; "
            "fits)",
        )
        switched = multi.cli("apply", "--auto-approve")
        chat.phase = draft.phase = "after switch"
        wait_for(lambda: chat.tally("after switch").ok >= 4, 60, "chat served by green")
        wait_for(lambda: draft.tally("after switch").ok >= 4, 60, "draft served on")
        chat.phase = draft.phase = "rollback"
        back = multi.cli("rollback", "1", "--deployment", "chat", "--auto-approve")
        chat.phase = draft.phase = "after rollback"
        wait_for(lambda: chat.tally("after rollback").ok >= 4, 60, "chat served by blue again")
    assert switched.returncode == 2, switched.stdout + switched.stderr
    assert "traffic moved to green" in switched.stdout and "down for 0.0s" in switched.stdout
    assert back.returncode in (0, 2) and "traffic moved to blue" in back.stdout, back.stdout + back.stderr
    for load in (chat, draft):
        s = load.summary()
        assert s["failed"] == 0 and s["cut"] == 0 and s["unserved"] == 0, s  # unserved: refused + unanswered
    assert chat.tally("switch").ok > 0 and draft.tally("switch").ok > 0

    views = _views(multi)
    assert front_master(views["chat"]) == master  # neither a restart nor a second master
    assert _workers(master) == workers  # nor a reload: draft's connections stayed on their worker
    assert not list(multi.state_dir.glob("deployments/*/front-*.cfg"))  # the rollback's spec too
    assert _color_pid(multi, "draft", "blue") == draft_pid and active_color(views["draft"]) == "blue"
    stats = _stats(views["chat"])
    # draft's backend as it was: blue serving (more sessions), green in maintenance and never used.
    assert stats[("vllm-draft", "blue")]["status"] != "MAINT"
    assert int(stats[("vllm-draft", "blue")]["stot"]) > int(before["stot"])
    assert (
        stats[("vllm-draft", "green")]["status"] == "MAINT" and stats[("vllm-draft", "green")]["stot"] == "0"
    )
    # chat's: green served between the switch and the rollback, blue again now.
    assert (
        int(stats[("vllm-chat", "green")]["stot"]) > 0 and stats[("vllm-chat", "green")]["status"] == "MAINT"
    )
    assert active_color(views["chat"]) == "blue"
    assert not supervising.marked_pids(scope_of(color_spec(views["chat"], "green")))
    assert (multi.state_dir / "front.cfg").read_text().count("\nfrontend ") == 2


@needs_haproxy
def test_a_switch_without_room_beside_the_other_deployment_drain_restarts_in_place(
    fronted: tuple[Multi, dict[str, Any]],
) -> None:
    multi, colors = fronted
    multi.write(fronted_spec(colors, 0.4))  # 0.4 x 2 + 0.4 (draft) = 1.2: the fake GPU holds no third
    first = multi.cli("apply", "--auto-approve")
    assert first.returncode == 2, first.stdout + first.stderr
    warned = (
        "deployment chat switches by drain-restart, not blue/green: GPU 0: gpu-memory-utilization 0.4 x 2 "
        "(chat blue + green) + 0.4 (draft) = 1.2, over 1.00 of the GPU [front.room]"
    )
    plan = multi.cli("plan")
    assert plan.returncode == 0 and warned in plan.stdout, plan.stdout
    chat_pid, draft_pid = _color_pid(multi, "chat", "blue"), _color_pid(multi, "draft", "blue")
    multi.write(fronted_spec(colors, 0.4, seqs=5))
    assert _switch(multi) == (
        "blue/green",
        "drain-restart (GPU 0: gpu-memory-utilization 0.4 x 2 (chat blue + green) + 0.4 (draft) = 1.2, "
        "over 1.00 of the GPU)",
    )
    switched = multi.cli("apply", "--auto-approve")
    assert switched.returncode == 2, switched.stdout + switched.stderr
    assert "traffic moved" not in switched.stdout and "down for" in switched.stdout
    views = _views(multi)
    assert active_color(views["chat"]) == "blue" and _color_pid(multi, "chat", "blue") != chat_pid
    assert not supervising.marked_pids(scope_of(color_spec(views["chat"], "green")))
    assert _color_pid(multi, "draft", "blue") == draft_pid
    assert multi.models("chat", multi.key("chat"))[0] == 200  # through HAProxy to the restarted blue


def test_ports_that_collide_across_fronted_deployments_are_refused_with_file_line_and_key(
    fronted: tuple[Multi, dict[str, Any]],
) -> None:
    multi, colors = fronted

    def collide(doc: Any) -> None:
        fronted_spec(colors, 0.3)(doc)
        doc["deployments"]["draft"]["server"]["port"] = multi.ports["chat"]  # chat's public port

    multi.write(collide)
    plan = multi.cli("plan")
    assert plan.returncode == 1, plan.stdout + plan.stderr
    text = multi.spec_path.read_text().splitlines()
    line = [n for n, t in enumerate(text, 1) if t.strip() == f"port = {multi.ports['chat']}"][-1]
    want = (
        f"{multi.spec_path}:{line}: deployments.draft.server.port: port {multi.ports['chat']} is its public "
        f"port (HAProxy) and deployment chat's public port (HAProxy) (deployments.chat.server.port, line "
    )
    assert want in plan.stdout, plan.stdout
    apply = multi.cli("apply", "--auto-approve")
    assert apply.returncode == 1 and "nothing was changed" in apply.stdout, apply.stdout + apply.stderr
    assert not (multi.state_dir / "front.cfg").exists() and not list(
        multi.state_dir.glob("deployments/*/*.pid")
    )

    def old_color_port(doc: Any) -> None:  # chat's colors serve on Unix sockets: its [front] ports are free
        collide(doc)
        doc["deployments"]["draft"]["server"]["port"] = colors["chat"][1]

    multi.write(old_color_port)
    plan = multi.cli("plan")
    assert "deployments.port" not in plan.stdout and "deployments.draft.server.port" not in plan.stdout, (
        plan.stdout
    )


@pytest.mark.parametrize(
    ("edit", "where"),
    [
        (
            lambda d: d.update(front={"ports": [9001, 9002]}),
            "front.ports: is per deployment beside [deployments.*]",
        ),
        (lambda d: d.update(front={}), "front: no deployment stands behind it"),
        (
            lambda d: d["deployments"]["chat"].update(
                front={"ports": [9001, d["deployments"]["chat"]["server"]["port"]]}
            ),
            "deployments.chat.front.ports: two different ports, neither of them its [server] port",
        ),
    ],
    ids=["machine-ports", "front-alone", "own-port"],
)
def test_a_front_that_cannot_be_is_one_line_naming_the_file_and_key(
    tmp_path: Path, edit: Any, where: str
) -> None:
    multi = Multi(tmp_path, {name: free_port() for name in NAMES})
    multi.write(edit)
    with pytest.raises(SpecError) as caught:
        load_spec(str(multi.spec_path))
    assert re.match(rf"{re.escape(str(multi.spec_path))}:\d+: ", str(caught.value)), str(caught.value)
    assert where in str(caught.value), str(caught.value)


def test_each_fronted_deployment_gets_its_own_frontend_in_one_config(tmp_path: Path) -> None:
    """The config is the machine's, in its state dir; a deployment without a front is not in it, and
    keeps its server on its own port (no colors)."""
    multi = Multi(tmp_path, {name: free_port() for name in NAMES})

    def only_chat(doc: Any) -> None:
        doc["deployments"]["chat"]["front"] = tomlkit.table()

    multi.write(only_chat)
    views = _views(multi)
    assert views["draft"].front is None
    text = haproxy.render(views["chat"], "green")
    assert f"frontend chat\n    bind 127.0.0.1:{multi.ports['chat']}\n    default_backend vllm-chat\n" in text
    blue, green = (server_socket(color_spec(views["chat"], c)) for c in COLORS)
    assert f"    server blue unix@{blue} disabled\n    server green unix@{green}\n" in text
    assert "draft" not in text and f"stats socket {multi.state_dir}/front.sock mode 600" in text


@needs_haproxy
def test_deployments_that_already_serve_move_behind_the_front_in_one_apply(
    fronted: tuple[Multi, dict[str, Any]],
) -> None:
    """Opting running deployments in: each one's server from before [front] (its own name, on the
    public port) drains and stops before its first color starts, and the shared config takes in a
    deployment only once its own apply moved it (the other's old server held that port until then)."""
    multi, colors = fronted
    multi.write()
    assert multi.cli("apply", "--auto-approve").returncode == 2
    old = {name: multi.pid(name) for name in NAMES}
    multi.write(fronted_spec(colors, 0.3))
    moved = multi.cli("apply", "--auto-approve")
    assert moved.returncode == 2, moved.stdout + moved.stderr
    assert moved.stdout.count("Apply converged") == 2, moved.stdout
    assert moved.stdout.count("(its server from before [front])") == 2, moved.stdout
    for name in NAMES:
        assert not Path(f"/proc/{old[name]}").exists()
        assert multi.models(name, multi.key(name))[0] == 200  # through HAProxy, to <name>-blue
    views = _views(multi)
    assert front_master(views["chat"]) is not None and front_master(views["chat"]) == front_master(
        views["draft"]
    )
    again = multi.cli("plan")
    assert again.returncode == 0 and again.stdout.count("No changes") == 2, again.stdout
