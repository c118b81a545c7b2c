"""Several deployments on one machine (specs/cpu-demo-multi.toml), with real parts: a real venv shared
by two fake vLLM servers (real processes on loopback, each its own port, key and max-num-seqs), one
apply lock, each deployment's state in its own subdir. A change to one restarts only that one; a GPU
that cannot hold every deployment placed on it is refused with the per-GPU sum."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tomlkit

from actions import supervising
from reconcile.errors import ReconcileError
from reconcile.host import http_request
from reconcile.identity import marker_value
from reconcile.ownership.membership import scope_of
from reconcile.spec.deployments import deployments
from reconcile.spec.loader import load_spec
from tests.apply_support import DEMO_MODEL, copy_venv, seed_venv
from tests.test_ansible import ansible_playbook, collections, playbook
from tests.test_server_support import FAKE_VLLM, free_port, generated_tokens

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
    assert _serving(multi) == (2, "chat 1, draft 2")  # the machine's generations: draft changed in 2
    # Rollback of one deployment: draft back to generation 1 (max-num-seqs 2), chat untouched.
    chat = multi.pid("chat")
    back = multi.cli("rollback", "1", "--deployment", "draft", "--auto-approve")
    assert back.returncode in (0, 2), back.stdout + back.stderr
    assert _flag(multi.pid("draft"), "--max-num-seqs") == "2" and multi.pid("chat") == chat
    held = multi.cli("plan")
    assert held.returncode == 0 and "held at generation 1 by rollback" in held.stdout, held.stdout
    assert _serving(multi) == (1, "chat 1, draft 1")  # one deployment's rollback moves the machine's too


def _serving(multi: Multi) -> tuple[int, str]:
    """The machine generation `history` marks serving (`*`): its number and each deployment's."""
    history = multi.cli("history")
    assert history.returncode == 0, history.stdout + history.stderr
    line = next((line for line in history.stdout.splitlines() if line.startswith("*")), "")
    found = re.match(r"\*\s*(\d+)\s+\S+ \S+\s+(.+?)\s{2,}", line)
    assert found is not None, history.stdout
    return int(found[1]), found[2]


def _seqs(multi: Multi) -> dict[str, str]:
    return {name: _flag(multi.pid(name), "--max-num-seqs") for name in NAMES}


def test_machine_generations_roll_the_whole_machine_back_and_history_follows(multi: Multi) -> None:
    assert multi.cli("apply", "--auto-approve").returncode == 2
    assert _serving(multi) == (1, "chat 1, draft 1") and _seqs(multi) == {"chat": "4", "draft": "2"}

    def seqs(name: str, n: int) -> Any:
        def edit(doc: Any) -> None:
            doc["deployments"][name]["server"]["args"]["max-num-seqs"] = n
            if name == "draft":
                doc["deployments"]["chat"]["server"]["args"]["max-num-seqs"] = 5

        return edit

    multi.write(seqs("chat", 5))  # change A: chat
    draft = multi.pid("draft")
    assert multi.cli("apply", "--auto-approve").returncode == 2
    assert _serving(multi) == (2, "chat 2, draft 1") and multi.pid("draft") == draft
    multi.write(seqs("draft", 3))  # change B: draft
    chat = multi.pid("chat")
    assert multi.cli("apply", "--auto-approve").returncode == 2
    assert _serving(multi) == (3, "chat 2, draft 2") and multi.pid("chat") == chat
    assert json.loads((multi.state_dir / "last-run.json").read_text())["machine_generation"] == 3
    assert _seqs(multi) == {"chat": "5", "draft": "3"}
    history = multi.cli("history").stdout
    assert "chat: generation 1 -> 2\n          args: --max-num-seqs 4 -> 5" in history, history
    assert "draft: generation 1 -> 2\n          args: --max-num-seqs 2 -> 3" in history, history
    diff = multi.cli("diff", "2", "3").stdout
    assert "chat: unchanged (generation 2)" in diff and "draft: generation 1 -> 2" in diff, diff
    assert "--deployment" not in multi.cli("history", "--deployment", "chat").stdout  # its own view
    assert multi.cli("history", "--deployment", "chat").stdout.count("args: --max-num-seqs 4 -> 5") == 1

    # Back to machine generation 2, then 1: each time the deployment that differs goes back through its
    # own rollback; the other is not touched (its pid stays) and is held where it is.
    back = multi.cli("rollback", "2", "--auto-approve")
    assert back.returncode in (0, 2), back.stdout + back.stderr
    assert "rolled the machine back to machine generation 2" in back.stdout
    assert multi.pid("chat") == chat and _seqs(multi) == {"chat": "5", "draft": "2"}
    assert _serving(multi) == (2, "chat 2, draft 1")
    draft = multi.pid("draft")
    back = multi.cli("rollback", "1", "--auto-approve")
    assert back.returncode in (0, 2), back.stdout + back.stderr
    assert multi.pid("draft") == draft and _seqs(multi) == {"chat": "4", "draft": "2"}
    assert _serving(multi) == (1, "chat 1, draft 1")
    for name in NAMES:
        assert multi.models(name, multi.key(name))[0] == 200
    held = multi.cli("plan")
    assert held.returncode == 0 and held.stdout.count("held at generation 1 by rollback") == 2, held.stdout
    resumed = multi.cli("resume")
    assert "released [chat]" in resumed.stdout and "released [draft]" in resumed.stdout, resumed.stdout
    assert multi.cli("plan").returncode == 2  # the spec again: both would change
    profile = multi.state_dir / "machine-profile"
    assert profile.stat().st_mode & 0o777 == 0o700
    assert {p.stat().st_mode & 0o777 for p in profile.iterdir()} == {0o600}


def test_machine_generation_records_are_private_and_a_changed_one_is_refused(tmp_path: Path) -> None:
    from reconcile.apply import machine_generations as mg

    old = os.umask(0)
    try:
        assert mg.record(str(tmp_path), {"chat": 1, "draft": 1}, reason="apply") == (1, True)
        assert mg.record(str(tmp_path), {"chat": 2, "draft": 1}, reason="apply") == (2, True)
        assert mg.record(str(tmp_path), {"chat": 1, "draft": 1}, reason="rollback") == (1, False)
    finally:
        os.umask(old)
    assert mg.current(str(tmp_path)) == 1 and mg.read(str(tmp_path), 2)["changed"] == ["chat"]
    profile = tmp_path / "machine-profile"
    assert profile.stat().st_mode & 0o777 == 0o700
    assert {p.stat().st_mode & 0o777 for p in profile.iterdir()} == {0o600}
    record = profile / "2.json"
    record.write_text(record.read_text().replace('"chat": 2', '"chat": 1'))  # not what reconcile wrote
    with pytest.raises(ReconcileError, match="sha256 is not the one reconcile recorded"):
        mg.read(str(tmp_path), 2)
    assert [n for n, g in mg.scan(str(tmp_path)) if isinstance(g, str)] == [2]
    assert mg.record(str(tmp_path), {"chat": 2, "draft": 1}, reason="apply") == (3, True)  # never 2's


def test_lock_says_what_floats_in_a_deployments_own_venv(multi: Multi) -> None:
    def own_venv(doc: Any) -> None:
        doc["venv"]["packages"] = {}  # the machine's: nothing to lock (no resolver run offline)
        venv = tomlkit.table()
        venv.update(path=str(multi.root / "draft-venv"), packages={"ninja": "*"})
        doc["deployments"]["draft"]["venv"] = venv

    multi.write(own_venv)
    locked = multi.cli("lock")
    assert locked.returncode == 0, locked.stdout + locked.stderr
    assert "note: deployments.draft.venv floats: `reconcile lock` does not pin" in locked.stderr
    assert "deployments.chat" not in locked.stderr and "nothing floats in the machine's" in locked.stdout


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


def test_deployments_with_one_venv_share_one_realization_in_the_machines_store(tmp_path: Path) -> None:
    """Issue 27: realizations are shared between deployments when their inputs are equal. Both
    deployments of the bundled spec use the machine's [venv]: on a fresh machine the plan of each names
    the same `<state_dir>/store/<hash>-venv`, not one store per deployment's state dir."""
    m = Multi(tmp_path, {name: free_port() for name in NAMES})
    m.write()
    plan = m.cli("plan")
    assert plan.returncode in (1, 2), plan.stdout + plan.stderr
    store = str(m.state_dir / "store") + "/"
    realized = sorted(set(re.findall(re.escape(store) + r"[0-9a-f]{32}-venv", plan.stdout)))
    assert len(realized) == 1, plan.stdout
    assert "deployments/chat/store" not in plan.stdout and "deployments/draft/store" not in plan.stdout


def test_bench_measures_each_deployment_through_its_own_key_and_keeps_it_in_its_own_records(
    multi: Multi,
) -> None:
    """Issue 27 item 5: `bench` per deployment and for all. Without --deployment each deployment's
    own server does the work (its token counter moves by what its rows generate), and each result is
    kept in that deployment's state dir with its generation; --deployment NAME measures that one alone."""
    profile = "\n[bench]\nrows = [{ prompt = 40, gen = 12 }]\n"
    multi.spec_path.write_text(multi.write().read_text() + profile)
    assert multi.cli("apply", "--auto-approve").returncode == 2
    before = {name: generated_tokens(multi.ports[name]) for name in NAMES}
    every = multi.cli("bench", "--json")
    assert every.returncode == 0, every.stdout + every.stderr
    data = json.loads(every.stdout)
    assert data["format"] == "reconcile-bench/1" and set(data["deployments"]) == set(NAMES)
    for name in NAMES:
        assert generated_tokens(multi.ports[name]) - before[name] == 12, name
        assert data["deployments"][name]["generation"] == 1
        kept = multi.state_dir / "deployments" / name / "bench" / "results.json"
        assert kept.exists() and stat.S_IMODE(kept.stat().st_mode) == 0o600
    one = multi.cli("bench", "--deployment", "draft")
    assert one.returncode == 0 and "SINGLE-STREAM DECODE" in one.stdout, one.stdout + one.stderr
    assert generated_tokens(multi.ports["draft"]) - before["draft"] == 24
    assert generated_tokens(multi.ports["chat"]) - before["chat"] == 12
