"""The apt actions against real apt and dpkg: tiny .deb files served from a local flat repository.

Tests marked `root` write /etc/apt/sources.list.d/reconcile-test-*.list and install packages named
reconcile-test-*; the module fixture purges them and refreshes apt's lists afterwards.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar, cast

import pytest

from actions import apt
from reconcile.errors import ActionError
from reconcile.spec.models import AptRepository
from tests import debs

SOURCES_DIR = "/etc/apt/sources.list.d"
ALPHA, BETA, GAMMA = "reconcile-test-alpha", "reconcile-test-beta", "reconcile-test-gamma"

F = TypeVar("F", bound=Callable[..., object])


def needs_apt(test: F) -> F:
    """Real apt/dpkg: root only, and only where the tools exist."""
    test = pytest.mark.root(test)
    test = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (dpkg, /etc/apt)")(test)
    missing = debs.missing_tools()
    return cast(F, pytest.mark.skipif(bool(missing), reason=f"missing {missing}")(test))


HOLD_LOCK = """
import fcntl, os, sys
fd = os.open("/var/lib/dpkg/lock-frontend", os.O_RDWR | os.O_CREAT, 0o640)
fcntl.lockf(fd, fcntl.LOCK_EX)  # the same fcntl lock apt and dpkg take
print("locked", flush=True)
sys.stdin.read()  # hold it until the test closes our stdin
"""


def _apt_get_update() -> None:
    subprocess.run(["apt-get", "update", "-qq"], check=True, capture_output=True)


@pytest.fixture(scope="module")
def local_repo() -> Iterator[AptRepository]:
    repo_path = debs.repo_dir()
    debs.build_deb(repo_path, ALPHA, "1.0")
    debs.build_deb(repo_path, BETA, "1.0")
    debs.build_deb(repo_path, BETA, "2.0")
    debs.scan(repo_path)
    repo = AptRepository(name=f"test-{os.getpid()}", uri=f"file:{repo_path}", suite="./", trusted=True)
    list_file = os.path.join(SOURCES_DIR, f"reconcile-{repo.name}.list")
    try:
        assert apt.add_repository(repo, SOURCES_DIR).changed
        started = time.monotonic()
        _apt_get_update()
        print(f"\napt-get update (all sources): {time.monotonic() - started:.1f} s")
        yield repo
    finally:
        debs.purge([ALPHA, BETA, GAMMA])
        if os.path.exists(list_file):
            os.unlink(list_file)
        _apt_get_update()
        shutil.rmtree(repo_path, ignore_errors=True)


@pytest.fixture
def clean() -> Iterator[None]:
    debs.purge([ALPHA, BETA, GAMMA])
    yield
    debs.purge([ALPHA, BETA, GAMMA])


def _payload(name: str) -> str:
    with open(os.path.join(debs.FILES_DIR, name)) as f:
        return f.read().strip()


# --- add_repository: any directory works, so most of it runs without root ---------------------


def test_add_repository_writes_a_signed_by_line_and_copies_the_key(tmp_path: Path) -> None:
    key_source = tmp_path / "vendor.gpg"
    key_source.write_bytes(b"\x99\x01binary-keyring")
    keyring = tmp_path / "keyrings" / "cuda.gpg"
    sources = tmp_path / "sources.list.d"
    repo = AptRepository(
        name="cuda",
        uri="https://example.invalid/cuda/repos/ubuntu2204/x86_64/",
        suite="/",
        keyring=str(keyring),
        key_source=str(key_source),
    )

    first = apt.add_repository(repo, str(sources))

    assert first.changed
    assert keyring.read_bytes() == b"\x99\x01binary-keyring"
    assert stat.S_IMODE(keyring.stat().st_mode) == 0o644
    lines = (sources / "reconcile-cuda.list").read_text().splitlines()
    assert lines[-1] == f"deb [signed-by={keyring}] https://example.invalid/cuda/repos/ubuntu2204/x86_64/ /"
    assert stat.S_IMODE((sources / "reconcile-cuda.list").stat().st_mode) == 0o644

    second = apt.add_repository(repo, str(sources))
    assert not second.changed
    assert "already lists" in second.message


def test_add_repository_keeps_an_existing_keyring(tmp_path: Path) -> None:
    keyring = tmp_path / "cuda.gpg"
    keyring.write_bytes(b"the admin's key")
    key_source = tmp_path / "other.gpg"
    key_source.write_bytes(b"another key")
    repo = AptRepository(
        name="c",
        uri="https://example.invalid/",
        suite="bookworm",
        components=["main"],
        keyring=str(keyring),
        key_source=str(key_source),
    )

    apt.add_repository(repo, str(tmp_path))

    assert keyring.read_bytes() == b"the admin's key"
    assert (
        (tmp_path / "reconcile-c.list")
        .read_text()
        .endswith(f"deb [signed-by={keyring}] https://example.invalid/ bookworm main\n")
    )


def test_add_repository_rewrites_a_list_that_drifted(tmp_path: Path) -> None:
    repo = AptRepository(name="local", uri="file:/srv/repo", suite="./", trusted=True)
    (tmp_path / "reconcile-local.list").write_text("deb http://wrong/ ./\n")

    result = apt.add_repository(repo, str(tmp_path))

    assert result.changed and "rewrote" in result.message
    assert (tmp_path / "reconcile-local.list").read_text().endswith("deb [trusted=yes] file:/srv/repo ./\n")


def test_add_repository_without_key_or_key_source_says_what_to_do(tmp_path: Path) -> None:
    repo = AptRepository(
        name="c", uri="https://example.invalid/", suite="/", keyring=str(tmp_path / "absent.gpg")
    )
    with pytest.raises(ActionError, match="key_source"):
        apt.add_repository(repo, str(tmp_path))
    assert not (tmp_path / "reconcile-c.list").exists()


def test_flat_suite_with_components_is_refused(tmp_path: Path) -> None:
    repo = AptRepository(name="c", uri="file:/srv", suite="./", components=["main"], trusted=True)
    with pytest.raises(ActionError, match="takes no components"):
        apt.add_repository(repo, str(tmp_path))


def test_parse_policy_reads_candidates_and_version_tables() -> None:
    text = (
        "bash:\n  Installed: 5.2.15-2+b8\n  Candidate: 5.2.15-2+b13\n  Version table:\n"
        "     5.2.15-2+b13 500\n        500 http://deb.debian.org/debian bookworm/main amd64 Packages\n"
        " *** 5.2.15-2+b8 100\n        100 /var/lib/dpkg/status\n"
        "virtual-thing:\n  Installed: (none)\n  Candidate: (none)\n  Version table:\n"
    )
    assert apt.parse_policy(text) == {
        "bash": ("5.2.15-2+b13", ("5.2.15-2+b13", "5.2.15-2+b8")),
        "virtual-thing": (None, ()),
    }


def test_parse_policy_rejects_what_it_cannot_read() -> None:
    with pytest.raises(ActionError, match="cannot parse"):
        apt.parse_policy("  Candidate: 1.0\n")


# --- real apt and dpkg -------------------------------------------------------------------------


@needs_apt
@pytest.mark.usefixtures("clean")
def test_install_installs_and_a_second_run_changes_nothing(local_repo: AptRepository) -> None:
    result = apt.install([ALPHA], update=False)

    assert result.changed and ALPHA in result.message
    assert debs.installed_version(ALPHA) == "1.0"
    assert _payload(ALPHA) == "1.0"

    again = apt.install([ALPHA], update=False)
    assert not again.changed
    assert again.message == f"already installed: {ALPHA}"


@needs_apt
def test_add_repository_twice_leaves_the_real_sources_file_alone(local_repo: AptRepository) -> None:
    list_file = os.path.join(SOURCES_DIR, f"reconcile-{local_repo.name}.list")
    before = os.stat(list_file)

    result = apt.add_repository(local_repo, SOURCES_DIR)

    assert not result.changed
    assert os.stat(list_file).st_ino == before.st_ino  # not even rewritten with the same bytes
    with open(list_file) as f:
        assert f.read().splitlines()[-1] == f"deb [trusted=yes] {local_repo.uri} ./"


@needs_apt
def test_apt_knows_answers_for_names_and_pinned_versions(local_repo: AptRepository) -> None:
    asked = [ALPHA, f"{BETA}=1.0", f"{BETA}=9.9", "reconcile-test-no-such-package"]

    assert apt.apt_knows(asked) == {
        ALPHA: True,
        f"{BETA}=1.0": True,
        f"{BETA}=9.9": False,
        "reconcile-test-no-such-package": False,
    }


@needs_apt
@pytest.mark.usefixtures("clean")
def test_pinned_version_installs_exactly_that_version_and_moves_both_ways(local_repo: AptRepository) -> None:
    apt.install([f"{BETA}=1.0"], update=False)
    assert debs.installed_version(BETA) == "1.0"  # not the newest (2.0)
    assert _payload(BETA) == "1.0"

    up = apt.install([f"{BETA}=2.0"], update=False)
    assert up.changed and f"{BETA} 1.0 -> 2.0" in up.message
    assert debs.installed_version(BETA) == "2.0"

    down = apt.install([f"{BETA}=1.0"], update=False)
    assert down.changed
    assert debs.installed_version(BETA) == "1.0"
    assert not apt.install([f"{BETA}=1.0"], update=False).changed


@needs_apt
@pytest.mark.usefixtures("clean")
def test_a_package_apt_cannot_find_fails_naming_it_and_the_fix(local_repo: AptRepository) -> None:
    with pytest.raises(ActionError) as missing:
        apt.install([ALPHA, "reconcile-test-no-such-package"], update=False)
    assert "reconcile-test-no-such-package" in str(missing.value)
    assert "[apt].repositories" in str(missing.value)
    assert debs.installed_version(ALPHA) is None  # one apt-get call: all or nothing

    with pytest.raises(ActionError, match=rf"{BETA}=9\.9"):
        apt.install([f"{BETA}=9.9"], update=False)


@needs_apt
@pytest.mark.usefixtures("clean")
def test_update_makes_a_package_added_to_the_repository_installable(local_repo: AptRepository) -> None:
    repo_path = local_repo.uri.removeprefix("file:")
    debs.build_deb(repo_path, GAMMA, "3.1")
    debs.scan(repo_path)
    assert apt.apt_knows([GAMMA]) == {GAMMA: False}
    with pytest.raises(ActionError, match=GAMMA):
        apt.install([GAMMA], update=False)

    result = apt.install([GAMMA], update=True)

    assert result.changed
    assert debs.installed_version(GAMMA) == "3.1"
    assert apt.apt_knows([GAMMA]) == {GAMMA: True}


@needs_apt
@pytest.mark.usefixtures("clean")
def test_a_broken_source_elsewhere_blocks_nothing_but_is_named_when_install_fails(
    local_repo: AptRepository,
) -> None:
    private = tempfile.mkdtemp(prefix="reconcile-apt-private-")  # 0700: apt's _apt user cannot read it
    open(os.path.join(private, "Packages"), "w").close()
    name = f"test-{os.getpid()}-private"
    broken = AptRepository(name=name, uri=f"file:{private}", suite="./", trusted=True)
    apt.add_repository(broken, SOURCES_DIR)
    try:
        assert apt.install([ALPHA], update=True).changed
        assert debs.installed_version(ALPHA) == "1.0"

        with pytest.raises(ActionError) as failed:
            apt.install(["reconcile-test-absent"], update=True)
    finally:
        os.unlink(os.path.join(SOURCES_DIR, f"reconcile-{broken.name}.list"))
        shutil.rmtree(private)

    assert "reconcile-test-absent" in str(failed.value)
    assert "apt-get update also failed" in str(failed.value)
    assert "directory world-readable" in str(failed.value)


def _hold_dpkg_lock() -> subprocess.Popen[str]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
    return holder


def _release(holder: subprocess.Popen[str]) -> None:
    assert holder.stdin is not None
    holder.stdin.close()
    holder.wait(timeout=10)


@needs_apt
@pytest.mark.usefixtures("clean")
def test_install_waits_while_another_process_holds_the_dpkg_lock(local_repo: AptRepository) -> None:
    holder = _hold_dpkg_lock()
    releaser = threading.Timer(3.0, _release, args=(holder,))
    started = time.monotonic()
    releaser.start()
    try:
        result = apt.install([ALPHA], update=False, lock_budget=30)
    finally:
        releaser.cancel()
        if holder.poll() is None:
            _release(holder)

    assert result.changed
    assert debs.installed_version(ALPHA) == "1.0"
    assert time.monotonic() - started >= 3.0  # it could only succeed once the lock was released


@needs_apt
@pytest.mark.usefixtures("clean")
def test_a_lock_held_past_the_budget_fails_naming_the_holder(local_repo: AptRepository) -> None:
    holder = _hold_dpkg_lock()
    started = time.monotonic()
    try:
        with pytest.raises(ActionError) as held:
            apt.install([ALPHA], update=False, lock_budget=2)
        elapsed = time.monotonic() - started
    finally:
        _release(holder)

    assert f"process {holder.pid}" in str(held.value)
    assert "more than 2 s" in str(held.value)
    assert 2 <= elapsed < 15
    assert debs.installed_version(ALPHA) is None
