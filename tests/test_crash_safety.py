"""Crash safety of `reconcile apply`, for real: the CLI is SIGKILLed at named points (between actions,
inside the config, key and manifest writes, per copied model file, around pip) and at seeded random
moments; the next apply must converge, config.json must always parse, its backup must be the original,
a key once written must never change, and no temp file may be left behind.

The named points are `reconcile.host.checkpoint` labels: RECONCILE_TEST_KILL_AT=<label> makes the
process SIGKILL itself there. The slow part is the venv, so only the points inside its creation start
from nothing; later points start from a copy of a venv made once by a real apply.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconcile.host import http_request
from tests.apply_support import DEMO_MODEL, Demo, demo_in, group_member, seed_venv

pytestmark = pytest.mark.slow

ORIGINAL_CONFIG = (DEMO_MODEL / "config.json").read_bytes()

# Points inside the venv's creation: the run starts from nothing.
FRESH = ["before:venv", "venv.created", "after:venv"]
# Points around the package install: the run starts from a venv without ninja.
BARE = ["before:venv.packages", "venv.pip.before", "venv.pip.after", "after:venv.packages"]
# Everything after: the run starts from a venv that has ninja. ("before:X" for a later X is the disk
# state of "after:" the Change before it, so only the first is listed.)
LATER = [
    "apply.locked",
    "before:model.files",
    "model.copy:chat_template.jinja",
    "model.copy:config.json",
    "model.copy:tokenizer_config.json",
    "atomic_write.partial:.reconcile-model.json",
    "after:model.files",
    "atomic_write.partial:config.json.bak",
    "atomic_write.rename:config.json.bak",
    "atomic_write.partial:config.json",
    "atomic_write.rename:config.json",
    "after:model.config",
    "atomic_write.partial:api.key",
    "atomic_write.rename:api.key",
    "after:api_key",
    "server.spawned",  # the server runs and no pidfile names it: the next apply adopts it
    "atomic_write.rename:demo.pid",
    "atomic_write.rename:server-{name}.json",
    "after:server",
    "apply.executed",
    "atomic_write.partial:1.json",
    "atomic_write.rename:last-run.json",
]


@contextlib.contextmanager
def demo_with(tmp_path: Path, seed: Path | None) -> Iterator[Demo]:
    yield from demo_in(tmp_path, seed)


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.getbasetemp()
    return {"bare": seed_venv(base, {}), "ninja": seed_venv(base, {"ninja": "*"})}


def check_model_files(demo: Demo) -> None:
    """What must hold at every moment: config.json parses, and a backup is the original's bytes."""
    config = demo.model_dir / "config.json"
    if config.exists():
        json.loads(config.read_bytes())
    backup = demo.model_dir / "config.json.bak"
    if backup.exists():
        assert backup.read_bytes() == ORIGINAL_CONFIG


def recover(demo: Demo, key_before: bytes | None) -> None:
    """The next apply, uninterrupted, converges; then the invariants of a converged demo hold."""
    run = demo.cli("apply", "--json")
    assert run.returncode in (0, 2), run.output
    data = run.json()
    assert data["converged"], run.output
    check_model_files(demo)
    assert json.loads((demo.model_dir / "config.json").read_bytes())["rope_parameters"]["factor"] == 2.0
    assert (demo.model_dir / "config.json.bak").read_bytes() == ORIGINAL_CONFIG
    key = demo.key_file.read_bytes()
    if key_before is not None:
        assert key == key_before  # a key once written is never replaced
    left = [p for p in demo.root.rglob("*.tmp") if demo.venv not in p.parents]
    assert left == []
    assert len(demo.server_pids()) == 2  # one server and its engine: no second deployment
    assert demo.pidfile.exists() and int(demo.pidfile.read_text()) in demo.server_pids()
    token = key.decode().strip()
    models = http_request(
        "GET", "127.0.0.1", demo.port, "/v1/models", headers={"Authorization": f"Bearer {token}"}
    )
    assert models.status == 200


def kill_at(demo: Demo, label: str) -> bytes | None:
    """Run apply with the kill point armed; it must die by SIGKILL there. Returns the key if one exists."""
    killed = demo.cli("apply", kill_at=label.format(name=demo.name))
    assert killed.returncode == -signal.SIGKILL, f"{label} was never reached:\n{killed.output}"
    check_model_files(demo)
    return demo.key_file.read_bytes() if demo.key_file.exists() else None


@pytest.mark.parametrize("label", FRESH)
def test_sigkill_inside_the_venv_creation_then_the_next_apply_converges(tmp_path: Path, label: str) -> None:
    with demo_with(tmp_path, None) as demo:
        recover(demo, kill_at(demo, label))


@pytest.mark.parametrize("label", BARE)
def test_sigkill_around_the_package_install_then_the_next_apply_converges(
    tmp_path: Path, seeds: dict[str, Path], label: str
) -> None:
    with demo_with(tmp_path, seeds["bare"]) as demo:
        recover(demo, kill_at(demo, label))


@pytest.mark.parametrize("label", LATER)
def test_sigkill_between_and_inside_later_actions_then_the_next_apply_converges(
    tmp_path: Path, seeds: dict[str, Path], label: str
) -> None:
    with demo_with(tmp_path, seeds["ninja"]) as demo:
        recover(demo, kill_at(demo, label))


def test_an_apply_killed_after_its_changes_leaves_their_generation_marked_incomplete(
    tmp_path: Path, seeds: dict[str, Path]
) -> None:
    with demo_with(tmp_path, seeds["ninja"]) as demo:
        kill_at(demo, "apply.executed")
        (record,) = demo.generations()
        assert (record["generation"], record["complete"], record["converged"]) == (1, False, False)
        assert [(c["resource"], c["result"]) for c in record["changes"]] == [
            (resource, "changed") for resource in ("model.files", "model.config", "api_key", "server")
        ]
        recover(demo, demo.key_file.read_bytes())
        assert len(demo.generations()) == 1  # the next apply found nothing to do: no new record


def kill_group_during(demo: Demo, needle: str, after: float) -> None:
    """Start apply in its own process group; once a member's command line holds `needle`, wait
    `after` seconds and SIGKILL the whole group (apply and the tool it runs, as a cgroup kill does)."""
    proc = demo.start("apply")
    deadline = time.monotonic() + 60
    while not group_member(proc.pid, needle):
        assert proc.poll() is None and time.monotonic() < deadline, f"{needle} never ran"
        time.sleep(0.01)
    time.sleep(after)
    os.killpg(proc.pid, signal.SIGKILL)
    assert demo.finish(proc).returncode == -signal.SIGKILL
    check_model_files(demo)


def test_sigkill_of_apply_and_pip_in_the_middle_of_the_install_then_the_next_apply_converges(
    tmp_path: Path, seeds: dict[str, Path]
) -> None:
    with demo_with(tmp_path, seeds["bare"]) as demo:
        kill_group_during(demo, "pip install", 0.4)
        recover(demo, None)


def test_sigkill_of_apply_and_venv_in_the_middle_of_ensurepip_then_the_next_apply_converges(
    tmp_path: Path,
) -> None:
    with demo_with(tmp_path, None) as demo:
        kill_group_during(demo, "ensurepip", 0.8)
        recover(demo, None)


@pytest.mark.parametrize("seed", range(4))
def test_sigkill_at_a_seeded_random_moment_then_the_next_apply_converges(
    tmp_path: Path, seeds: dict[str, Path], seed: int
) -> None:
    delay = random.Random(f"reconcile-crash-{seed}").uniform(0.2, 2.5)
    with demo_with(tmp_path, seeds["bare"]) as demo:
        proc = demo.start("apply")
        with contextlib.suppress(ProcessLookupError):
            time.sleep(delay)
            os.killpg(proc.pid, signal.SIGKILL)
        run = demo.finish(proc)
        assert run.returncode in (-signal.SIGKILL, 2), run.output
        check_model_files(demo)
        recover(demo, demo.key_file.read_bytes() if demo.key_file.exists() else None)
