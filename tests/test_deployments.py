"""Several deployments on one machine (specs/cpu-demo-multi.toml), with real parts: a real venv shared
by two fake vLLM servers (real processes on loopback, each its own port, key and max-num-seqs), one
apply lock, each deployment's state in its own subdir. A change to one restarts only that one; a GPU
that cannot hold every deployment placed on it is refused with the per-GPU sum."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tomlkit

from actions import supervising
from reconcile.host import http_request
from reconcile.identity import marker_value
from reconcile.ownership.membership import scope_of
from reconcile.spec.deployments import deployments
from reconcile.spec.loader import load_spec
from tests.apply_support import DEMO_MODEL, copy_venv, seed_venv
from tests.test_ansible import ansible_playbook, collections, playbook
from tests.test_server_support import FAKE_VLLM, free_port

REPO = Path(__file__).resolve().parent.parent
MULTI_SPEC = REPO / "specs" / "cpu-demo-multi.toml"
NAMES = ("chat", "draft")
__all__ = ["collections"]  # the fixture: the reconcile.vllm collection built and installed


@dataclass
class Multi:
    root: Path
    ports: dict[str, int]

    @property
    def spec_path(self) -> Path:
        return self.root / "spec" / "multi.toml"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    def pid(self, name: str) -> int:
        return int((self.state_dir / "deployments" / name / f"{name}.pid").read_text().split()[0])

    def key(self, name: str) -> str:
        return (self.root / f"{name}.key").read_text().strip()

    def write(self, edit: Any = None, path: Path | None = None) -> Path:
        text = MULTI_SPEC.read_text().replace("/tmp/reconcile-demo-multi", str(self.root))
        text = text.replace("{spec_dir}/demo-model", str(DEMO_MODEL))
        text = text.replace("{spec_dir}/../tests/fakes/vllm", str(FAKE_VLLM))
        doc = tomlkit.parse(text)
        for name in NAMES:
            server = doc["deployments"][name]["server"]
            server["port"] = self.ports[name]
            env = tomlkit.inline_table()
            env.update(dict(server["env"]))
            env.update(FAKE_VLLM_STARTUP_DELAY="0.1")  # FAKE_VLLM_HOLD: one fake GPU under root
            server["env"] = env
        if edit is not None:
            edit(doc)
        target = path or self.spec_path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(tomlkit.dumps(doc))
        return target

    def cli(self, *args: str, spec: Path | None = None) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "reconcile", *args, "--spec", str(spec or self.spec_path)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=str(self.root))

    def models(self, name: str, key: str | None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        answer = http_request("GET", "127.0.0.1", self.ports[name], "/v1/models", headers=headers)
        return answer.status, json.loads(answer.body) if answer.status == 200 else None


@pytest.fixture
def multi(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Multi]:
    m = Multi(tmp_path, {name: free_port() for name in NAMES})
    m.write()
    copy_venv(seed_venv(tmp_path_factory.getbasetemp(), {"ninja": "*"}), tmp_path / "venv")
    markers = [
        marker_value(d.loaded.spec.server.name, d.loaded.spec.machine.state_dir)
        for d in deployments(load_spec(str(m.spec_path)))
    ]
    try:
        yield m
    finally:
        try:  # what proves each deployment's processes: its cgroup, its records, its marker
            scopes: list[Any] = [scope_of(d.loaded.spec) for d in deployments(load_spec(str(m.spec_path)))]
        except Exception:  # a test broke the spec on purpose: the markers alone
            scopes = list(markers)
        for scope in scopes:
            supervising.stop_marked(scope, timeout=5.0)


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def _flag(pid: int, flag: str) -> str:
    argv = _cmdline(pid)
    return argv[argv.index(flag) + 1]


def test_the_bundled_multi_spec_loads_as_two_deployments_with_their_own_state() -> None:
    every = deployments(load_spec(str(MULTI_SPEC)))
    assert [d.name for d in every] == ["chat", "draft"]
    chat, draft = (d.loaded.spec for d in every)
    assert (chat.server.name, chat.server.port, chat.server.args["max-num-seqs"]) == ("chat", 18010, 4)
    assert (draft.server.name, draft.server.port, draft.server.args["max-num-seqs"]) == ("draft", 18011, 2)
    assert chat.venv == draft.venv  # one venv for both: equal inputs, one realization
    assert chat.machine.state_dir == "/tmp/reconcile-demo-multi/state/deployments/chat"
    assert every[0].loaded.sha256 != every[1].loaded.sha256


def test_two_deployments_converge_serve_through_their_keys_and_a_change_restarts_only_one(
    multi: Multi,
) -> None:
    first = multi.cli("apply", "--auto-approve", "--textfile", str(multi.root / "metrics" / "r.prom"))
    assert first.returncode == 2, first.stdout + first.stderr
    assert first.stdout.count("Apply converged") == 2
    for name, seqs, length in (("chat", "4", 2048), ("draft", "2", 1024)):
        status, body = multi.models(name, multi.key(name))
        assert status == 200 and [m["id"] for m in body["data"]] == [name]
        assert body["data"][0]["max_model_len"] == length
        assert multi.models(name, None)[0] == 401
        assert multi.models(name, multi.key("draft" if name == "chat" else "chat"))[0] == 401
        assert _flag(multi.pid(name), "--max-num-seqs") == seqs
    # Each deployment's records in its own subdir; the machine's report lists them.
    for name in NAMES:
        run = json.loads((multi.state_dir / "deployments" / name / "last-run.json").read_text())
        assert (run["deployment"], run["exit_code"], run["converged"]) == (name, 2, True)
    machine = json.loads((multi.state_dir / "last-run.json").read_text())
    assert set(machine["deployments"]) == set(NAMES)
    metrics = (multi.root / "metrics" / "r.prom").read_text()
    assert 'reconcile_converged{deployment="chat"} 1' in metrics
    assert 'reconcile_converged{deployment="draft"} 1' in metrics
    assert metrics.count("# TYPE reconcile_converged gauge") == 1

    again = multi.cli("plan")
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.count("No changes") == 2

    chat, draft = multi.pid("chat"), multi.pid("draft")

    def more_seqs(doc: Any) -> None:
        doc["deployments"]["draft"]["server"]["args"]["max-num-seqs"] = 3

    multi.write(more_seqs)
    plan = multi.cli("plan")
    assert plan.returncode == 2 and "restart draft" in plan.stdout and "restart chat" not in plan.stdout
    second = multi.cli("apply", "--auto-approve", "--json")
    assert second.returncode == 2, second.stdout + second.stderr
    data = json.loads(second.stdout)
    assert [r["resource"] for r in data["deployments"]["draft"]["results"]] == ["server"]
    assert data["deployments"]["chat"]["results"] == []
    assert multi.pid("chat") == chat and multi.pid("draft") != draft
    assert _flag(multi.pid("draft"), "--max-num-seqs") == "3"
    assert multi.models("chat", multi.key("chat"))[0] == 200
    # Generations per deployment: only the changed one has a second.
    assert multi.cli("history", "--deployment", "chat").stdout.count("\n") < multi.cli(
        "history", "--deployment", "draft"
    ).stdout.count("\n")
    status = multi.cli("status", "--deployment", "chat", "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    assert json.loads(status.stdout)["deployments"]["chat"]["server"]["state"] == "healthy"
    check = multi.cli("check")
    assert check.returncode == 0 and check.stdout.count("passed") == 2, check.stdout
    history = multi.cli("history")
    assert history.returncode == 0 and history.stdout.count("── deployment") == 2, history.stdout
    assert history.stdout.index("── deployment chat") < history.stdout.index("── deployment draft")
    rollback = multi.cli("rollback", "1", "--auto-approve")
    assert rollback.returncode == 1 and "name one with --deployment NAME" in rollback.stderr
    # Rollback of one deployment: draft back to generation 1 (max-num-seqs 2), chat untouched.
    chat = multi.pid("chat")
    back = multi.cli("rollback", "1", "--deployment", "draft", "--auto-approve")
    assert back.returncode in (0, 2), back.stdout + back.stderr
    assert _flag(multi.pid("draft"), "--max-num-seqs") == "2" and multi.pid("chat") == chat
    held = multi.cli("plan")
    assert held.returncode == 0 and "held at generation 1 by rollback" in held.stdout, held.stdout


def _shared_gpu(share: float) -> Any:
    def edit(doc: Any) -> None:
        gpu = tomlkit.table()
        gpu.update(count=1, memory_gib=141.0)
        doc["gpu"] = gpu
        for name in NAMES:
            doc["deployments"][name]["server"]["args"]["gpu-memory-utilization"] = share

    return edit


def test_deployments_that_cannot_share_a_gpu_are_refused_with_the_per_gpu_sum(multi: Multi) -> None:
    multi.write(_shared_gpu(0.6))
    plan = multi.cli("plan")
    assert plan.returncode == 1, plan.stdout + plan.stderr
    assert "GPU 0: gpu-memory-utilization sums to 1.2 = 0.6 (chat) + 0.6 (draft)" in plan.stdout
    apply = multi.cli("apply", "--auto-approve")
    assert apply.returncode == 1, apply.stdout + apply.stderr
    assert "preflight error(s) across deployments; nothing was changed" in apply.stdout
    assert not (multi.root / "models").exists()
    kept = multi.state_dir / "deployments"
    assert not list(kept.glob("*/*.pid")) and not list(kept.glob("*/generations"))  # only the reports
    assert json.loads((kept / "chat" / "last-run.json").read_text())["outcome"] == "refused"

    multi.write(_shared_gpu(0.3))
    fits = multi.cli("plan", "--json")
    found = [
        f
        for f in json.loads(fits.stdout)["deployments"]["chat"]["findings"]
        if f["rule"] == "memory.shared_gpu"
    ]
    assert [(f["severity"], f["evidence"]["sum"]) for f in found] == [("info", 0.6)]
    assert (
        "GPU 0: gpu-memory-utilization sums to 0.6 = 0.3 (chat) + 0.3 (draft); fits"
        in multi.cli("plan").stdout
    )


def test_ports_served_names_and_parallel_sizes_that_collide_are_refused_by_plan(multi: Multi) -> None:
    def collide(doc: Any) -> None:
        draft = doc["deployments"]["draft"]["server"]
        draft["port"] = multi.ports["chat"]
        draft["served_model_name"] = "chat"
        doc["deployments"]["draft"]["gpus"] = [0, 1]

    multi.write(collide)
    plan = multi.cli("plan")
    assert plan.returncode == 1
    assert f"deployments chat and draft both listen on port {multi.ports['chat']}" in plan.stdout
    assert "deployments chat and draft both serve the model name 'chat'" in plan.stdout
    assert "deployment draft: tensor x pipeline parallel is 1, but it may use 2 GPU(s)" in plan.stdout


@pytest.mark.parametrize(
    ("edit", "where"),
    [
        (
            lambda d: d["deployments"]["draft"]["server"].update(bogus=1),
            "deployments.draft.server.bogus: unknown key",
        ),
        (lambda d: d.update(server={"name": "x", "log": "/x"}), "server: is set beside [deployments.*]"),
        (
            lambda d: (d.update(gpu={"count": 1}), d["deployments"]["chat"].update(gpus=[0, 1])),
            "deployments.chat.gpus[1]: GPU 1 is not on this machine ([gpu] count = 1: 0-0)",
        ),
    ],
    ids=["unknown-key", "server-beside", "gpu-index"],
)
def test_a_bad_deployment_is_one_line_naming_the_file_and_key(multi: Multi, edit: Any, where: str) -> None:
    multi.write(edit)
    plan = multi.cli("plan")
    assert plan.returncode == 1 and "Traceback" not in plan.stderr
    line = plan.stderr.strip().splitlines()[-1]
    assert re.match(rf"reconcile: {re.escape(str(multi.spec_path))}:\d+: ", line) and where in line, line


def test_a_spec_of_today_is_the_one_deployment_named_default(tmp_path: Path) -> None:
    demo = REPO / "specs" / "cpu-demo.toml"
    loaded = load_spec(str(demo))
    (only,) = deployments(loaded)
    assert only.name == "default" and only.loaded is loaded  # the same spec: same plan, same state
    argv = [sys.executable, "-m", "reconcile", "plan", "--spec", str(demo), "--deployment", "other"]
    wrong = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert wrong.returncode == 1 and "no deployment 'other' (the spec has: default)" in wrong.stderr


@pytest.mark.slow
def test_the_ansible_module_lists_every_deployment_in_its_facts(collections: Path, multi: Multi) -> None:
    out = ansible_playbook(collections, playbook(multi, multi.spec_path))  # type: ignore[arg-type]
    result = out["result"]
    assert out["rc"] == 0 and result["changed"] is True, result.get("msg") or result
    facts = result["ansible_facts"]["reconcile"]
    assert set(facts["deployments"]) == set(NAMES) and facts["converged"] is True
    assert all(d["converged"] and d["generation"] == 1 for d in facts["deployments"].values())
    assert {r["deployment"] for r in result["results"] if r["resource"] == "server"} == set(NAMES)
    assert result["generation"] == {"chat": 1, "draft": 1}

    multi.write(_shared_gpu(0.6))
    refused = ansible_playbook(collections, playbook(multi, multi.spec_path))  # type: ignore[arg-type]
    assert refused["rc"] != 0 and "GPU 0: gpu-memory-utilization sums to 1.2" in refused["result"]["msg"]


def test_validate_refuses_an_over_subscribed_gpu_in_the_fleet_repository(tmp_path: Path) -> None:
    """The CI check of a fleet repository sees the per-GPU sum before any machine does."""
    text = MULTI_SPEC.read_text().replace("gpu-memory-utilization = 0.4", "gpu-memory-utilization = 0.6")
    text = text.replace("{spec_dir}/../tests/fakes/vllm", "/usr/bin/true")
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "box.toml").write_text(
        text.replace('source = "{spec_dir}/demo-model"', 'repo = "o/m"')
    )
    argv = [sys.executable, "-m", "reconcile", "validate", str(tmp_path / "specs")]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert run.returncode == 1, run.stdout + run.stderr
    assert (
        "error memory.shared_gpu: GPU 0: gpu-memory-utilization sums to 1.2 = 0.6 (chat) + 0.6 (draft)"
        in (run.stdout + run.stderr)
    )


def test_pausing_the_machine_holds_every_deployments_scheduled_apply(multi: Multi) -> None:
    paused = multi.cli("pause", "--reason", "moving racks")
    assert paused.returncode == 0, paused.stdout + paused.stderr
    held = multi.cli("apply", "--scheduled")
    assert held.returncode == 0, held.stdout + held.stderr
    assert held.stdout.count("not applied: paused by") == 2 and "moving racks" in held.stdout
    assert not list(multi.state_dir.glob("deployments/*/*.pid"))
    status = json.loads(multi.cli("status", "--json").stdout)
    assert all("moving racks" in d["pause"]["text"] for d in status["deployments"].values())
    assert multi.cli("resume").returncode == 0
    ran = multi.cli("apply", "--scheduled")
    assert ran.returncode == 2 and {multi.pid("chat"), multi.pid("draft")}, ran.stdout + ran.stderr
