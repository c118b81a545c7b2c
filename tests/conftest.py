"""Fixtures shared by the tests that run the CLI on a copy of the demo spec (tests/apply_support.py)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.apply_support import Demo, demo_in, seed_venv
from tests.ownership_support import foreign_pids


@pytest.fixture(autouse=True)
def _umask_022() -> Iterator[None]:
    """Each test starts under the usual umask 022: the CLI run in-process (main([...])) sets its own
    077 for good, which would otherwise leak into the next test's directories (seen: nobody could not
    enter a test's 0700 directory in the full run, only there)."""
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.fixture
def yard() -> Iterator[Path]:
    """A root-owned 0755 directory under /var/tmp that `nobody` can reach, so a test's attacker acts
    there as itself (setpriv): pytest's tmp_path is 0700. Removed after the test."""
    path = Path(tempfile.mkdtemp(prefix="reconcile-yard-", dir="/var/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def outside(yard: Path) -> Path:
    """The hostile rounds' name for `yard`: where the attacker's files go, outside pytest's 0700 tmp."""
    return yard


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    """A fresh copy of the demo spec with its own paths, name and port."""
    yield from demo_in(tmp_path)


@pytest.fixture
def seeded(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """A demo whose venv (with ninja) is already there: a copy of one made by a real apply."""
    yield from demo_in(tmp_path, seed_venv(tmp_path_factory.getbasetemp(), {"ninja": "*"}))


@pytest.fixture
def strangers() -> Iterator[list[int]]:
    """Pids of the foreign processes a test starts (tests/ownership_support.py); killed after it."""
    yield from foreign_pids()
