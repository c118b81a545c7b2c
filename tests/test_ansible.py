"""The reconcile.vllm Ansible collection, for real: built with `ansible-galaxy collection build`,
installed into a temp dir, and run by `ansible-playbook` against localhost on a copy of the CPU demo.

Check mode changes nothing and reports the drift; apply converges (changed), a second apply is ok;
a bad spec fails naming FILE:LINE; a preflight error fails naming the rule. Slow-ish (each
ansible-playbook run is ~2 s of Ansible's own start), so one demo is shared by the ordered tests.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconcile.host import http_request
from tests.apply_support import Demo, demo_in, tree_state

REPO = Path(__file__).resolve().parent.parent
COLLECTION_SRC = REPO / "integrations" / "ansible"
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.slow


def _tool(name: str) -> str:
    path = BIN / name
    return str(path) if path.exists() else (shutil.which(name) or name)


@pytest.fixture(scope="module")
def collections(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The collection built from integrations/ansible and installed, as a user would."""
    out = tmp_path_factory.mktemp("ansible")
    build = subprocess.run(
        [_tool("ansible-galaxy"), "collection", "build", str(COLLECTION_SRC), "--output-path", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (tarball,) = out.glob("reconcile-vllm-*.tar.gz")
    target = out / "collections"
    install = subprocess.run(
        [_tool("ansible-galaxy"), "collection", "install", str(tarball), "-p", str(target)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    module = target / "ansible_collections" / "reconcile" / "vllm" / "plugins" / "modules" / "apply.py"
    assert module.is_file()
    return target


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    yield from demo_in(tmp_path_factory.mktemp("demo"))


def playbook(demo: Demo, spec: Path, **options: Any) -> Path:
    task = {"spec": str(spec), "executable": str(BIN / "reconcile"), "lock_timeout": 60, **options}
    play = [
        {
            "name": "Converge the CPU demo",
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "tasks": [{"name": "reconcile", "reconcile.vllm.apply": task, "register": "out"}],
        }
    ]
    path = demo.root / f"play-{spec.stem}.yml"
    path.write_text(json.dumps(play))  # JSON is YAML
    return path


def ansible_playbook(collections: Path, play: Path, *flags: str) -> dict[str, Any]:
    """Run ansible-playbook; the task's result (saved by the core `tree` callback), the recap's counts."""
    tree = collections.parent / "tree"
    shutil.rmtree(tree, ignore_errors=True)
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": str(collections),
        "ANSIBLE_CALLBACKS_ENABLED": "ansible.builtin.tree",
        "ANSIBLE_CALLBACK_TREE_DIR": str(tree),
        "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
        "ANSIBLE_LOCALHOST_WARNING": "false",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false",
        "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
        "ANSIBLE_HOME": str(collections.parent / "home"),
        "ANSIBLE_NOCOLOR": "1",
    }
    proc = subprocess.run(
        [_tool("ansible-playbook"), "-i", "localhost,", str(play), *flags],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    recap = re.search(r"^localhost\s*:\s*(.*)$", proc.stdout, re.M)
    assert recap is not None and (tree / "localhost").is_file(), proc.stdout + proc.stderr
    stats = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", recap.group(1))}
    result: dict[str, Any] = json.loads((tree / "localhost").read_text())
    return {"rc": proc.returncode, "result": result, "stats": stats, "stdout": proc.stdout}


def test_check_mode_reports_the_drift_and_changes_nothing(collections: Path, demo: Demo) -> None:
    before = tree_state(demo.root, set())
    out = ansible_playbook(collections, playbook(demo, demo.spec_path), "--check", "--diff")
    result = out["result"]
    assert out["rc"] == 0 and result["changed"] is True and out["stats"]["failed"] == 0, result
    assert result["exit_code"] == 2 and result["cmd"][1] == "plan"
    pending = {r["resource"] for r in result["resources"] if r["status"] == "change"}
    assert {"venv", "model.files", "api_key", "server"} <= pending
    # --diff: each pending resource as its own before/after, as Ansible prints diffs.
    assert "--- before: server (before)\n+++ after: server (after apply)" in out["stdout"]
    assert "+++ after: api_key (after apply)" in out["stdout"] and '+file: "' in out["stdout"]
    assert out["stats"]["changed"] == 1
    # Nothing on the machine: no venv, no model, no key, no server, no new file but the playbook.
    after = tree_state(demo.root, set())
    assert set(after) - set(before) == {"play-demo.yml"}
    assert not demo.venv.exists() and not demo.key_file.exists() and demo.server_pids() == []


def test_apply_converges_then_a_second_apply_is_ok(collections: Path, demo: Demo) -> None:
    first = ansible_playbook(collections, playbook(demo, demo.spec_path), "--diff")
    result = first["result"]
    assert first["rc"] == 0 and result["changed"] is True, result.get("msg") or result
    assert result["exit_code"] == 2 and result["generation"] == 1
    done = {r["resource"] for r in result["results"] if r["result"] == "changed"}
    assert {"venv", "model.files", "api_key", "server"} <= done
    assert "+++ after: server (applied)" in first["stdout"]
    facts = result["ansible_facts"]["reconcile"]
    assert facts["converged"] is True and facts["vllm_version"] == "0.26.0" and facts["gpus"] == []
    key = demo.key_file.read_text().strip()
    status = http_request(
        "GET", "127.0.0.1", demo.port, "/v1/models", headers={"Authorization": f"Bearer {key}"}
    ).status
    assert status == 200
    pid = int(demo.pidfile.read_text().split()[0])

    second = ansible_playbook(collections, playbook(demo, demo.spec_path))
    result = second["result"]
    assert second["rc"] == 0 and result["changed"] is False, result
    assert result["exit_code"] == 0 and second["stats"]["ok"] == 1 and second["stats"]["changed"] == 0
    assert int(demo.pidfile.read_text().split()[0]) == pid  # the server was left alone


def test_a_bad_spec_fails_naming_file_and_line(collections: Path, demo: Demo) -> None:
    bad = demo.root / "spec" / "bad.toml"
    bad.write_text(demo.spec_path.read_text().replace(f"port = {demo.port}", 'port = "eighty"'))
    line = next(n for n, text in enumerate(bad.read_text().splitlines(), 1) if text.startswith("port ="))
    out = ansible_playbook(collections, playbook(demo, bad))
    result = out["result"]
    assert out["rc"] == 2 and out["stats"]["failed"] == 1 and result["exit_code"] == 1, result
    assert re.match(rf"{re.escape(str(bad))}:{line}: server\.port: ", result["msg"]), result["msg"]


def test_a_preflight_error_fails_naming_the_rule(collections: Path, demo: Demo) -> None:
    spec = demo.root / "spec" / "too-long.toml"
    spec.write_text(demo.spec_path.read_text().replace("max-model-len = 2048", "max-model-len = 100000"))
    for flags in (("--check",), ()):
        out = ansible_playbook(collections, playbook(demo, spec), *flags)
        result = out["result"]
        assert out["rc"] == 2 and out["stats"]["failed"] == 1 and result["exit_code"] == 1, result
        assert result["msg"].startswith("preflight max-model-len.derived: max-model-len 100,000 is above")
        assert "(fix: " in result["msg"]


def test_the_rolling_playbook_gates_the_fleet_then_converges_and_checks(
    collections: Path, tmp_path: Path
) -> None:
    # The fleet repository: a git repo with specs/<hostname>.toml, as docs/fleets.md lays it out.
    import socket

    gen = demo_in(tmp_path / "fleet-demo")
    demo = next(gen)
    try:
        repo = tmp_path / "specs-repo"
        (repo / "specs").mkdir(parents=True)
        host = socket.gethostname().split(".")[0]
        shutil.copy(demo.spec_path, repo / "specs" / f"{host}.toml")
        for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "fleet specs"]):
            git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args]
            subprocess.run(git, cwd=repo, check=True, capture_output=True)
        extra = json.dumps(
            {
                "reconcile_hosts": "localhost",
                "reconcile_repo": str(repo),
                "reconcile_dir": str(tmp_path / "checkout"),
                "reconcile_bin": str(BIN / "reconcile"),
                "ansible_connection": "local",
                "ansible_become": False,
            }
        )
        env = {
            **os.environ,
            "ANSIBLE_COLLECTIONS_PATH": str(collections),
            "ANSIBLE_LOCALHOST_WARNING": "false",
            "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
            "ANSIBLE_HOME": str(collections.parent / "home"),
            "ANSIBLE_NOCOLOR": "1",
        }
        proc = subprocess.run(
            [_tool("ansible-playbook"), "-i", "localhost,", "reconcile.vllm.rolling", "-e", extra],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        plays = proc.stdout.split("PLAY [")
        assert plays[1].startswith("Gate") and plays[2].startswith("Roll out")
        verify = re.search(r"TASK \[Verify serving[^\]]*\] \**\n(\w+): \[localhost\]", plays[2])
        assert verify is not None and verify.group(1) == "ok", plays[2]
        assert re.search(r"^localhost\s*:\s*ok=\d+\s+changed=[1-9]", proc.stdout, re.M)
        assert demo.server_pids(), "the server runs after the rollout"
    finally:
        gen.close()


def test_the_module_documents_exactly_the_options_it_takes(collections: Path) -> None:
    # What `ansible-test sanity`'s validate-modules checks first (it does not run offline: it fetches
    # a pip bootstrap script): DOCUMENTATION, EXAMPLES and RETURN parse, and the documented options
    # are the argument_spec's, with the same types and defaults.
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": str(collections),
        "ANSIBLE_HOME": str(collections.parent),
    }
    proc = subprocess.run(
        [_tool("ansible-doc"), "-t", "module", "--json", "reconcile.vllm.apply"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)["reconcile.vllm.apply"]
    assert doc["examples"].strip() and set(doc["return"]) >= {"exit_code", "resources", "ansible_facts"}
    options = doc["doc"]["options"]
    source = (COLLECTION_SRC / "plugins" / "modules" / "apply.py").read_text()
    spec_text = source[source.index("argument_spec={") : source.index("supports_check_mode")]
    for name, opt in options.items():
        assert f'"{name}": {{"type": "{opt["type"]}"' in spec_text, name
        if "default" in opt:
            assert f'"default": {json.dumps(opt["default"]).replace("true", "True")}' in spec_text, name
    assert spec_text.count('"type":') == len(options)
