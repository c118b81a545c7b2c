"""Faults other than SIGKILL across a real `reconcile apply` of the CPU demo: a full disk (a small tmpfs)
while config.json, its backup or the key is written, a permission error (an immutable directory), and the
loopback hub cutting every download. The failing apply must stop cleanly (exit 4, one line per result,
the server left as it was); the next one, the fault gone, must converge with nothing lost: config.json
valid, its backup the original, a key once written never changed. (SIGKILL: tests/test_crash_safety.py.)
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconcile.host import http_request
from tests.apply_support import DEMO_MODEL, Demo, demo_in, seed_venv
from tests.fakes.hub_server import FakeHub

pytestmark = [pytest.mark.slow, pytest.mark.root]

ORIGINAL_CONFIG = (DEMO_MODEL / "config.json").read_bytes()
PAGE = os.sysconf("SC_PAGE_SIZE")


@pytest.fixture
def seeded(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """A demo whose venv (with ninja) is a copy of one made by a real apply: the slow part, done once."""
    yield from demo_in(tmp_path / "demo", seed_venv(tmp_path_factory.getbasetemp(), {"ninja": "*"}))


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "1m") -> Iterator[Path]:
    """A small tmpfs mounted at `path` (skip where mounting is refused), unmounted afterwards."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], check=True)


def fill(fs: Path, leave_pages: int = 0) -> Path:
    """Fill the filesystem at `fs` up to `leave_pages` free pages (tmpfs counts whole pages)."""
    filler = fs / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for _ in range(os.statvfs(fs).f_bavail - leave_pages):
            os.write(fd, b"\0" * PAGE)
    finally:
        os.close(fd)
    assert os.statvfs(fs).f_bavail == leave_pages
    return filler


def apply(demo: Demo) -> tuple[int, dict[str, dict[str, Any]], str]:
    """`reconcile apply --json`: exit code, results by resource, and everything it printed."""
    run = demo.cli("apply", "--json")
    assert "Traceback" not in run.output, run.output
    data = run.json()
    return run.returncode, {r["resource"]: r for r in data["results"]}, run.output


def health(demo: Demo) -> int:
    return http_request("GET", "127.0.0.1", demo.port, "/health").status


def temps(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def converge(demo: Demo, key: bytes | None, factor: float) -> bytes:
    """The next apply converges, with nothing lost; returns the key."""
    code, results, output = apply(demo)
    assert code == 2, output
    assert all(r["result"] in ("changed", "already-true") for r in results.values()), output
    config = json.loads((demo.model_dir / "config.json").read_bytes())
    assert config["rope_parameters"]["factor"] == factor
    assert (demo.model_dir / "config.json.bak").read_bytes() == ORIGINAL_CONFIG
    assert temps(demo.model_dir) == []
    now = demo.key_file.read_bytes()
    assert len(now.strip()) >= 32 and (key is None or now == key)
    assert health(demo) == 200
    assert demo.cli("plan").returncode == 0
    return now


def set_factor(factor: float) -> Any:
    def edit(doc: Any) -> None:
        doc["model"]["config"]["rope_parameters"]["factor"] = factor

    return edit


def drop_patch(doc: Any) -> None:
    del doc["model"]["config"]


@pytest.mark.parametrize("free_pages", [0, 1], ids=["at-the-backup", "after-the-backup"])
def test_a_full_disk_while_config_json_is_patched_loses_nothing_and_the_next_apply_converges(
    seeded: Demo, free_pages: int
) -> None:
    def in_place(doc: Any) -> None:  # the model dir itself on the small tmpfs: no store
        doc["venv"]["store"] = False

    with tmpfs(seeded.root / "models"):
        # The model's files first, unpatched: then only the patch writes.
        seeded.write_spec(lambda doc: (drop_patch(doc), in_place(doc)))
        code, _, output = apply(seeded)
        assert code == 2, output
        key, pid = seeded.key_file.read_bytes(), seeded.server_pids()
        seeded.write_spec(in_place)
        filler = fill(seeded.root / "models", free_pages)

        code, results, output = apply(seeded)

        assert code == 4, output
        assert results["model.config"]["result"] == "failed"
        assert "No space left on device" in results["model.config"]["message"]
        assert "config.json" in results["model.config"]["message"]  # names the file ...
        assert "free some space" in results["model.config"]["message"]  # ... and the fix
        assert "\n" not in results["model.config"]["message"]
        assert results["server"]["result"] == "blocked"  # not stopped for a restart that cannot happen
        assert seeded.server_pids() == pid and health(seeded) == 200
        assert (seeded.model_dir / "config.json").read_bytes() == ORIGINAL_CONFIG  # untouched, valid
        backup = seeded.model_dir / "config.json.bak"
        assert backup.exists() == bool(free_pages)  # one free page: the backup fits, the new config not
        if free_pages:
            assert backup.read_bytes() == ORIGINAL_CONFIG
        assert temps(seeded.model_dir) == []
        assert seeded.key_file.read_bytes() == key

        filler.unlink()
        converge(seeded, key, 2.0)


def test_a_full_disk_while_the_key_is_written_leaves_no_key_then_one_that_never_changes(seeded: Demo) -> None:
    keys = seeded.root / "keys"

    def key_on_tmpfs(doc: Any) -> None:
        doc["api_key"]["file"] = str(keys / "api.key")

    seeded.write_spec(key_on_tmpfs)
    with tmpfs(keys, "64k"):
        os.chmod(keys, 0o700)
        filler = fill(keys)

        code, results, output = apply(seeded)

        assert code == 4, output
        assert results["api_key"]["result"] == "failed"
        assert "No space left on device" in results["api_key"]["message"]
        message = results["api_key"]["message"]
        assert "api.key" in message and "free some space" in message  # the file and the fix
        assert results["server"]["result"] == "blocked"  # it would serve without its key
        assert results["model.config"]["result"] == "changed"  # independent changes still ran
        assert sorted(p.name for p in keys.iterdir()) == ["filler"]  # no key, no half-written temp file
        assert seeded.server_pids() == []

        filler.unlink()
        code, results, output = apply(seeded)
        assert code == 2, output
        key = (keys / "api.key").read_bytes()
        assert len(key.strip()) >= 32 and oct((keys / "api.key").stat().st_mode)[-3:] == "600"

        # Full again, and the key's mode is wrong: fixing the mode needs no space, and the key stays.
        filler = fill(keys)
        os.chmod(keys / "api.key", 0o644)
        code, results, output = apply(seeded)
        assert code == 2 and results["api_key"]["result"] == "changed", output
        assert (keys / "api.key").read_bytes() == key
        assert oct((keys / "api.key").stat().st_mode)[-3:] == "600"
        filler.unlink()
        assert seeded.cli("plan").returncode == 0


def test_a_permission_error_on_the_model_dir_changes_nothing_and_the_next_apply_converges(
    seeded: Demo,
) -> None:
    key = converge(seeded, None, 2.0)
    pid = seeded.server_pids()
    patched = (seeded.model_dir / "config.json").read_bytes()
    seeded.write_spec(set_factor(4.0))
    if subprocess.run(["chattr", "+i", str(seeded.model_dir)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is refused on this filesystem")
    try:
        code, results, output = apply(seeded)
    finally:
        subprocess.run(["chattr", "-i", str(seeded.model_dir)], check=True)

    assert code == 4, output
    assert results["model.config"]["result"] == "failed"
    assert "Operation not permitted" in results["model.config"]["message"]
    assert results["server"]["result"] == "blocked"
    assert seeded.server_pids() == pid and health(seeded) == 200
    assert (seeded.model_dir / "config.json").read_bytes() == patched
    assert (seeded.model_dir / "config.json.bak").read_bytes() == ORIGINAL_CONFIG
    assert temps(seeded.model_dir) == []

    converge(seeded, key, 4.0)
    assert seeded.server_pids() != pid  # restarted once, for the new config.json


HUB_REPO = "demo-org/demo-model"
WEIGHTS = os.urandom(512 * 1024)


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with FakeHub() as h:
        files = {p.name: p.read_bytes() for p in DEMO_MODEL.iterdir() if p.is_file()}
        h.add_commit(HUB_REPO, {**files, "model.safetensors": WEIGHTS})
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        yield h


def from_hub(doc: Any) -> None:
    del doc["model"]["source"]
    doc["model"]["repo"] = HUB_REPO


def test_a_hub_that_cuts_every_download_fails_only_the_model_then_the_next_apply_converges(
    seeded: Demo, hub: FakeHub
) -> None:
    seeded.write_spec(from_hub)
    hub.drop_connection("model.safetensors", after_bytes=64 * 1024, times=1000)

    code, results, output = apply(seeded)

    assert code == 4, output
    assert results["model.files"]["result"] == "failed"
    assert "\n" not in results["model.files"]["message"] and HUB_REPO in results["model.files"]["message"]
    assert results["model.config"]["result"] == "blocked" and results["server"]["result"] == "blocked"
    assert results["api_key"]["result"] == "changed"  # independent of the model
    key = seeded.key_file.read_bytes()
    config = seeded.model_dir / "config.json"
    if config.exists():
        assert config.read_bytes() == ORIGINAL_CONFIG  # a config.json there is the hub's, whole
    assert not (seeded.model_dir / "config.json.bak").exists()
    assert len(hub.downloads("model.safetensors")) >= 2  # retried before giving up

    hub.drop_connection("model.safetensors", after_bytes=0, times=0)
    converge(seeded, key, 2.0)
    assert (seeded.model_dir / "model.safetensors").read_bytes() == WEIGHTS


def test_a_hub_that_cuts_one_download_is_retried_within_the_same_apply(seeded: Demo, hub: FakeHub) -> None:
    seeded.write_spec(from_hub)
    hub.drop_connection("model.safetensors", after_bytes=64 * 1024, times=1)

    converge(seeded, None, 2.0)

    assert (seeded.model_dir / "model.safetensors").read_bytes() == WEIGHTS
    assert len(hub.downloads("model.safetensors")) == 2
