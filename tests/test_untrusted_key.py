"""Issue 24, class 2: the API key file and `[server] secret_files` are read as data. A FIFO, a
directory or another non-regular file at their path is named by `plan` and refused by `apply`,
and neither waits on it (a FIFO's open blocks until a writer comes). The real CLI on the demo
spec with its server running.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
import tomlkit

from tests.apply_support import Demo

BOUND = 60  # seconds: a plan or apply that takes longer has hung
NOT_CONVERGED = 4


def plant(path: Path, what: str) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    if what == "fifo":
        os.mkfifo(path, 0o600)
    else:
        path.mkdir(mode=0o700)


@pytest.mark.parametrize("what, named", [("fifo", "a FIFO"), ("directory", "a directory")])
def test_a_fifo_or_directory_at_the_key_path_is_named_and_refused_without_hanging(
    seeded: Demo, what: str, named: str
) -> None:
    assert seeded.cli("apply").returncode == 2  # the server runs: plan reads the key for its identity
    plant(seeded.key_file, what)
    started = time.monotonic()
    plan = seeded.cli("plan", timeout=BOUND)  # old code (fifo): hung opening it for the server's identity
    assert f"{seeded.key_file} is {named}, not a regular file" in plan.output, plan.output
    assert plan.returncode == 2 and "Traceback" not in plan.output
    apply = seeded.cli("apply", timeout=BOUND)
    assert time.monotonic() - started < BOUND
    assert apply.returncode == NOT_CONVERGED, apply.output
    assert f"{seeded.key_file} is {named}, not a regular file" in apply.output
    assert "Traceback" not in apply.output
    assert (seeded.state_dir / "apply.lock").exists()
    assert seeded.cli("plan", timeout=BOUND).returncode == 2  # the lock was released


def test_a_fifo_at_a_secret_files_path_is_named_and_refused_without_hanging(seeded: Demo) -> None:
    token = seeded.root / "hf.token"
    token.write_text("hf_secret\n")
    token.chmod(0o600)

    def edit(doc: tomlkit.TOMLDocument) -> None:
        table = tomlkit.inline_table()
        table.update({"HF_TOKEN": str(token)})
        doc["server"]["secret_files"] = table  # type: ignore[index]

    seeded.write_spec(edit)
    assert seeded.cli("apply").returncode == 2
    plant(token, "fifo")
    started = time.monotonic()
    plan = seeded.cli("plan", timeout=BOUND)  # old code: hung opening it for the server's identity
    assert "Traceback" not in plan.output and plan.returncode == 1, plan.output  # a preflight error
    assert f"HF_TOKEN {token} is a FIFO, not a regular file" in plan.output, plan.output
    apply = seeded.cli("apply", timeout=BOUND)  # old code: hung the same way, the apply lock held
    assert time.monotonic() - started < BOUND
    assert "Traceback" not in apply.output and apply.returncode == 1, apply.output
    assert f"HF_TOKEN {token} is a FIFO, not a regular file" in apply.output, apply.output
    assert seeded.server_pids()  # the running server is left alone


def test_a_key_file_larger_than_any_key_is_not_read_whole(seeded: Demo) -> None:
    assert seeded.cli("apply").returncode == 2
    with open(seeded.key_file, "r+b") as f:  # 1 GiB of holes after the key
        f.truncate(1 << 30)
    apply = seeded.cli("apply", timeout=BOUND)
    assert "Traceback" not in apply.output, apply.output
    assert "larger than 65536 bytes" in apply.output, apply.output
