"""`reconcile init` on real files: this machine's spec plans as converged; a venv holding vLLM, the
toolkit's apt packages and a running server (the fake `vllm`, its key never copied) are found."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomlkit

from reconcile.authoring.init_draft import render_spec
from reconcile.authoring.init_survey import find_servers, parse_serve_args, probe_machine, write_spec
from reconcile.cli import main
from reconcile.plan.planner import make_plan
from reconcile.spec.loader import load_spec
from tests.test_server_support import FAKE_VLLM, free_port, wait_for

SECRET = "sk-init-must-never-copy-this"


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def sections_have_comments(text: str) -> list[str]:
    """Each [section] header and the line under it: the comment that says what it controls."""
    lines = text.splitlines()
    return [
        h
        for n, h in enumerate(lines)
        if re.fullmatch(r"\[[a-z_.]+\]", h) and not lines[n + 1].startswith("# ")
    ]


def test_init_on_this_machine_writes_a_spec_that_plans_converged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "specs" / "this-host.toml"

    assert main(["init", "--out", str(out), "--state-dir", str(tmp_path / "state")]) == 0

    text = out.read_text()
    assert text.startswith("# Written by `reconcile init`") and "\n[machine]\n" in text
    assert sections_have_comments(text) == []
    assert f"next: reconcile plan --spec {out}" in capsys.readouterr().out
    assert main(["plan", "--spec", str(out)]) == 0
    assert "No changes. The machine matches the spec." in capsys.readouterr().out


def test_init_does_not_overwrite_a_spec_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "box.toml"
    out.write_text("# mine\n")

    assert main(["init", "--out", str(out)]) == 1
    assert out.read_text() == "# mine\n" and "not overwritten" in capsys.readouterr().err

    assert main(["init", "--out", str(out), "--force", "--state-dir", str(tmp_path / "state")]) == 0
    assert out.read_text().startswith("# Written by `reconcile init`")


def make_vllm_venv(root: Path, version: str = "0.26.0") -> Path:
    """A real venv (no pip: fast) whose site-packages holds vllm and ninja's metadata, bin/vllm the fake."""
    venv = root / "opt" / "vllm-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    [site] = venv.glob("lib/python3*/site-packages")
    for name, v in (("vllm", version), ("ninja", "1.13.0")):
        dist = site / f"{name}-{v}.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {v}\n")
    (venv / "bin" / "vllm").symlink_to(FAKE_VLLM)
    return venv


def test_a_venv_with_vllm_is_found_and_its_version_pinned(tmp_path: Path) -> None:
    venv = make_vllm_venv(tmp_path)
    no_processes = tmp_path / "empty-proc"
    no_processes.mkdir()

    facts = probe_machine(venv_globs=(str(tmp_path / "opt" / "*" / "bin" / "vllm"),), proc=str(no_processes))
    write_spec(str(tmp_path / "box.toml"), render_spec(facts, state_dir=str(tmp_path / "state")), force=False)

    spec = load_spec(str(tmp_path / "box.toml")).spec
    assert spec.venv is not None and spec.venv.path == str(venv)
    assert spec.venv.packages == {"vllm": "==0.26.0", "ninja": "*"}
    plan = make_plan(load_spec(str(tmp_path / "box.toml")))
    assert plan.exit_code == 0 and [c.resource for c in plan.changes] == []
    assert [i.resource for i in plan.items if i.resource.startswith("venv")] == ["venv", "venv.packages"]


@pytest.fixture
def running_server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, int]]:
    """The fake `vllm serve` started from a venv's bin/vllm, as a person would, in its own session."""
    venv = make_vllm_venv(tmp_path)
    model = tmp_path / "models" / "tiny"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 4096, "model_type": "llama"}))
    port, log = free_port(), tmp_path / "vllm.log"
    argv = [
        str(venv / "bin" / "vllm"),
        "serve",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        "tiny",
        "--max-model-len",
        "1024",
        "--enforce-eager",
        "--api-key",
        SECRET,
        "--hf-overrides",
        '{"rope_parameters": {"factor": 2.0}}',
    ]
    env = {
        "PATH": f"{venv}/bin:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "VLLM_LOGGING_LEVEL": "DEBUG",
        "HF_TOKEN": "hf_never_copied",
        "FAKE_VLLM_STARTUP_DELAY": "0.2",
        "FAKE_VLLM_HOLD": str(tmp_path / "gpus"),
        "FAKE_VLLM_MAX_LIFETIME": "60",
    }
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: any(s.pid == proc.pid for s in find_servers()), 20, "the server in /proc")
        yield proc, venv, port
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the server and the engine children it spawned
        proc.wait(10)


def test_a_running_server_gives_its_args_but_never_its_key(
    tmp_path: Path, running_server: tuple[subprocess.Popen[bytes], Path, int]
) -> None:
    proc, venv, port = running_server
    out = tmp_path / "box.toml"

    assert (
        main(["init", "--out", str(out), "--pid", str(proc.pid), "--state-dir", str(tmp_path / "state")]) == 0
    )

    text = out.read_text()
    assert SECRET not in text and "hf_never_copied" not in text
    block = text[text.index("# [deployments.tiny.model]") :]
    drafted = tomlkit.parse("\n".join(ln[2:] for ln in block.splitlines() if ln.startswith("# ")))
    server = drafted["deployments"]["tiny"]["server"]
    assert (server["port"], server["served_model_name"], server["log"]) == (
        port,
        "tiny",
        str(tmp_path / "vllm.log"),
    )
    assert server["args"] == {
        "max-model-len": 1024,
        "enforce-eager": True,
        "hf-overrides": {"rope_parameters": {"factor": 2.0}},
    }
    assert server["env"] == {"VLLM_LOGGING_LEVEL": "DEBUG"}
    assert "Put the key it uses now (--api-key) in this file first" in text
    loaded = load_spec(str(out))
    assert loaded.spec.server is None and loaded.spec.venv is not None and loaded.spec.venv.path == str(venv)
    assert make_plan(loaded).exit_code == 0  # the commented server is not part of what it describes


def test_manage_server_writes_the_found_server_as_live_sections(
    tmp_path: Path, running_server: tuple[subprocess.Popen[bytes], Path, int]
) -> None:
    proc, _, port = running_server
    out = tmp_path / "box.toml"

    assert (
        main(
            [
                "init",
                "--out",
                str(out),
                "--pid",
                str(proc.pid),
                "--manage-server",
                "--state-dir",
                str(tmp_path / "state"),
            ]
        )
        == 0
    )

    whole = load_spec(str(out)).spec
    assert list(whole.deployments) == ["tiny"]  # the new form: one deployment, named after the server
    spec = whole.deployments["tiny"]
    assert spec.server is not None and spec.model is not None and spec.api_key is not None
    assert (spec.server.name, spec.server.port, spec.server.served_model_name) == ("tiny", port, "tiny")
    assert spec.server.args == {
        "max-model-len": 1024,
        "enforce-eager": True,
        "hf-overrides": {"rope_parameters": {"factor": 2.0}},
    }
    assert spec.model.dir == str(tmp_path / "models" / "tiny") and spec.server.executable is None
    assert SECRET not in out.read_text()


def test_init_with_a_pid_that_is_not_vllm_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["init", "--out", str(tmp_path / "x.toml"), "--pid", str(os.getpid())]) == 1
    assert "not a running `vllm serve`" in capsys.readouterr().err


def test_serve_arguments_are_read_as_vllm_reads_them() -> None:
    model, args, key = parse_serve_args(
        [
            "/m/nemotron",
            "--tensor-parallel-size",
            "2",
            "--gpu-memory-utilization=0.9",
            "--no-enable-log-requests",
            "--served-model-name",
            "a",
            "b",
            "--api-key",
            "sk-x",
            "--seed",
            "-1",
            "--trust-remote-code",
        ]
    )
    assert model == "/m/nemotron" and key is True
    assert args == {
        "tensor-parallel-size": 2,
        "gpu-memory-utilization": 0.9,
        "enable-log-requests": False,
        "served-model-name": ["a", "b"],
        "seed": -1,
        "trust-remote-code": True,
    }
    assert parse_serve_args(["--model", "org/x", "--port", "9"])[:2] == ("org/x", {"port": 9})


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("dpkg-deb") is None, reason="needs root and dpkg")
def test_installed_toolkit_packages_become_the_apt_section(tmp_path: Path) -> None:
    """The packages a person installed, not those they pulled in (apt marks those automatic)."""
    from tests.debs import build_deb, installed_version, purge

    asked, pulled = "cuda-reconcile-init-test-99-9", "libcureconcile-dev-99-9"
    debs = [build_deb(str(tmp_path), asked, "99.9.1"), build_deb(str(tmp_path), pulled, "99.9.2")]
    try:
        for _ in range(20):  # another test may hold dpkg's lock for a moment
            done = subprocess.run(["dpkg", "-i", *debs], capture_output=True, text=True)
            if done.returncode == 0 or "lock" not in done.stderr:
                break
            time.sleep(0.5)
        assert installed_version(asked) == "99.9.1" and installed_version(pulled) == "99.9.2", done.stderr
        subprocess.run(["apt-mark", "auto", pulled], check=True, capture_output=True)
        empty = tmp_path / "proc"
        empty.mkdir()

        facts = probe_machine(venv_globs=(), proc=str(empty))
        text = render_spec(facts, state_dir=str(tmp_path / "state"))

        assert facts.cuda_packages.get(asked) == "99.9.1" and pulled not in facts.cuda_packages
        (tmp_path / "box.toml").write_text(text)
        loaded = load_spec(str(tmp_path / "box.toml"))
        assert loaded.spec.apt is not None and asked in loaded.spec.apt.packages
        assert make_plan(loaded).exit_code == 0
    finally:
        subprocess.run(["apt-mark", "manual", pulled], capture_output=True)
        purge([asked, pulled])
