"""Issue 24, class 2: a `[model] source` tree that a local user (`nobody`) writes is data. Its files
are copied by root as regular files only (a FIFO is refused by name, without hanging), with modes
reduced to 0644/0755, sparse files kept sparse, a total bounded by the destination's free space,
and each file copied as big as it was when opened. The real CLI on a spec with [machine] and [model].
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.apply_support import DEMO_MODEL, Run

NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
BOUND = 60  # seconds: a plan or apply that takes longer has hung
NOT_CONVERGED = 4  # apply's exit code when a change failed or cannot be made


class Tree:
    """A model source owned by `nobody` (the attacker), its copy in a root-owned model dir."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.source = root / "source"
        self.dir = root / "models" / "m"
        self.spec = root / "spec.toml"
        shutil.copytree(DEMO_MODEL, self.source)
        (self.source / "tokenizer").mkdir()
        (self.source / "tokenizer" / "extra.txt").write_bytes(b"")
        for path in [self.source, *self.source.rglob("*")]:
            os.chown(path, _nobody_uid(), _nogroup_gid())
        self.spec.write_text(
            f'[machine]\nstate_dir = "{root}/state"\n\n'
            f'[model]\nsource = "{self.source}"\ndir = "{self.dir}"\n'
            'config = { rope_parameters = { rope_type = "yarn", factor = 2.0 } }\n'
        )

    def cli(self, *args: str, timeout: float = BOUND) -> Run:
        argv = [sys.executable, "-m", "reconcile", *args, "--spec", str(self.spec)]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=self.root)
        return Run(argv, proc.returncode, proc.stdout, proc.stderr)

    def as_nobody(self, *argv: str) -> None:
        subprocess.run([*NOBODY, *argv], check=True, timeout=10)

    def copied(self) -> Path:
        """Where the copy is: `dir` (a link to the current realization in the store), or before the
        link is made (an apply that did not converge), the one realization there."""
        if self.dir.exists():
            return Path(os.path.realpath(self.dir))
        (only,) = (self.root / "state" / "store").glob("*-model")
        return only

    def manifest(self) -> dict[str, object]:
        data = json.loads((self.copied() / ".reconcile-model.json").read_text())
        assert isinstance(data, dict)
        return data

    def leftovers(self) -> list[str]:
        return sorted(p.name for p in self.dir.rglob("*") if p.name.endswith(".tmp"))


def _nobody_uid() -> int:
    import pwd

    return pwd.getpwnam("nobody").pw_uid


def _nogroup_gid() -> int:
    import grp

    return grp.getgrnam("nogroup").gr_gid


@pytest.fixture
def tree() -> Iterator[Tree]:
    # Under /tmp, root's and 0755: nobody must reach its own source (pytest's tmp dirs are 0700).
    root = Path(tempfile.mkdtemp(prefix="reconcile-trees-"))
    os.chmod(root, 0o755)
    try:
        yield Tree(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def lock_is_free(tree: Tree) -> bool:
    with open(tree.root / "state" / "apply.lock", "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(f, fcntl.LOCK_UN)
    return True


def test_setuid_setgid_sticky_and_world_writable_source_files_are_copied_0755_or_0644(tree: Tree) -> None:
    modes = {"suid": 0o4755, "sgid": 0o2755, "sticky": 0o1644, "open": 0o777, "private": 0o610}
    for name, mode in modes.items():
        path = tree.source / name
        path.write_bytes(b"#!/bin/sh\nid\n")
        os.chown(path, _nobody_uid(), _nogroup_gid())
        os.chmod(path, mode)  # after chown, which clears set-id bits
        assert stat.S_IMODE(path.stat().st_mode) == mode
    run = tree.cli("apply")
    assert run.returncode == 2, run.output
    # never readable by others when the source was not ("private": 0644 would hand it to every user)
    want = {"suid": 0o755, "sgid": 0o755, "sticky": 0o644, "open": 0o755, "private": 0o700}
    for name, mode in want.items():
        st = (tree.dir / name).stat()
        # old code: suid 4755 root-owned (nobody -> root), sgid 2755, sticky 1644
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (mode, 0), name
    for path in tree.dir.rglob("*"):
        st = path.lstat()
        assert st.st_uid == 0 and not st.st_mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | 0o022), path
    assert tree.cli("plan").returncode == 0
    # config.json once patched takes another path (placed beside its backup): the same modes
    config = tree.source / "config.json"
    config.write_text(config.read_text().replace('"silu"', '"gelu"'))
    os.chmod(config, 0o4755)
    assert tree.cli("apply").returncode == 2
    for name in ("config.json", "config.json.bak"):
        st = (tree.dir / name).stat()
        assert st.st_uid == 0 and not st.st_mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | 0o022), name


def test_a_fifo_in_the_source_is_refused_by_name_in_plan_and_apply_without_hanging(tree: Tree) -> None:
    assert tree.cli("apply").returncode == 2
    # The attacker swaps an empty file for a FIFO: same size (0), new stamp, so old code hashed it.
    (tree.source / "tokenizer" / "extra.txt").unlink()
    tree.as_nobody("mkfifo", str(tree.source / "tokenizer" / "extra.txt"))
    tree.as_nobody("mkfifo", str(tree.source / "tokenizer" / "new.fifo"))
    before = sorted(p.name for p in tree.dir.rglob("*"))
    started = time.monotonic()
    plan = tree.cli("plan")  # old code: hung here (TimeoutExpired)
    assert "tokenizer/extra.txt is a FIFO, not a regular file: refused" in plan.output, plan.output
    assert plan.returncode == 2 and "Traceback" not in plan.output
    apply = tree.cli("apply")  # old code: hung hashing it, the apply lock held
    assert time.monotonic() - started < BOUND
    assert apply.returncode == NOT_CONVERGED, apply.output
    assert "tokenizer/extra.txt is a FIFO, not a regular file" in apply.output
    assert "Traceback" not in apply.output
    assert sorted(p.name for p in tree.dir.rglob("*")) == before  # nothing half-copied
    assert tree.leftovers() == []
    assert lock_is_free(tree)


def test_a_fifo_in_place_of_the_model_dirs_json_files_does_not_hang_the_plan(tree: Tree) -> None:
    assert tree.cli("apply").returncode == 2
    for name in ("config.json", "hf_quant_config.json", ".reconcile-model.json"):
        path = tree.dir / name
        kept = path.read_bytes() if path.exists() else None
        path.unlink(missing_ok=True)
        os.mkfifo(path)  # a damaged model dir (or one another tool fills)
        plan = tree.cli("plan")  # old code: read_json's open() hung
        assert "Traceback" not in plan.output, plan.output
        if name == "config.json":
            assert plan.returncode == 2, plan.output
            assert f"{tree.copied() / name}: a FIFO, not a regular file" in plan.output, plan.output
            apply = tree.cli("apply")  # old code: hung reading it
            assert apply.returncode == NOT_CONVERGED and "a FIFO, not a regular file" in apply.output
        path.unlink()
        if kept is not None:
            path.write_bytes(kept)


def test_a_sparse_gib_in_the_source_is_copied_sparse(tree: Tree) -> None:
    sparse = tree.source / "sparse.bin"
    tree.as_nobody("truncate", "-s", "1G", str(sparse))
    with open(sparse, "r+b") as f:  # some data in the middle and at the end: holes on both sides
        f.seek(512 << 20)
        f.write(b"x" * 4096)
        f.seek((1 << 30) - 4096)
        f.write(b"y" * 4096)
    run = tree.cli("apply")
    assert run.returncode == 2, run.output
    copy = tree.dir / "sparse.bin"
    assert copy.stat().st_size == 1 << 30
    assert copy.stat().st_blocks * 512 < 16 << 20  # old code: 1 GiB of allocated blocks
    with open(copy, "rb") as f:
        f.seek(512 << 20)
        assert f.read(4097) == b"x" * 4096 + b"\0"
        f.seek((1 << 30) - 4097)
        assert f.read() == b"\0" + b"y" * 4096
    assert tree.cli("plan").returncode == 0


def test_a_source_bigger_than_the_free_space_is_refused_before_a_byte_is_copied(tree: Tree) -> None:
    st = os.statvfs(tree.root)
    free = st.f_bavail * st.f_frsize
    huge = tree.source / "huge.bin"
    tree.as_nobody("truncate", "-s", str(free + (1 << 30)), str(huge))
    plan = tree.cli("plan")  # named before apply runs
    assert "the files to write are" in plan.output and "huge.bin: " in plan.output, plan.output
    assert plan.returncode == 2 and "apply cannot fix" in plan.output, plan.output
    run = tree.cli("apply")
    # old code: filled the disk (the holes read as zeros and written)
    assert run.returncode == NOT_CONVERGED, run.output
    assert "the files to write are" in run.output and "huge.bin: " in run.output, run.output
    assert "more than the" in run.output and "free on" in run.output, run.output
    assert not (tree.dir / "huge.bin").exists() and not (tree.dir / "config.json").exists()
    assert tree.leftovers() == [] if tree.dir.exists() else True


def test_a_file_growing_while_it_is_copied_is_copied_as_it_was_opened(tree: Tree) -> None:
    growing = tree.source / "growing.bin"
    growing.write_bytes(os.urandom(8 << 20))
    os.chown(growing, _nobody_uid(), _nogroup_gid())
    # nobody appends 64 KiB every millisecond, up to 512 MiB, while the apply runs
    appender = subprocess.Popen(
        [
            *NOBODY,
            sys.executable,
            "-c",
            "import sys, time\n"
            "f = open(sys.argv[1], 'ab', buffering=0)\n"
            "for _ in range(8192):\n"
            "    f.write(b'z' * 65536); time.sleep(0.001)\n",
            str(growing),
        ]
    )
    try:
        run = tree.cli("apply")
    finally:
        appender.kill()
        appender.wait()
    # Converged (it stopped growing), or the re-plan saw it grow: either way a bounded copy.
    assert run.returncode in (2, NOT_CONVERGED) and "Traceback" not in run.output, run.output
    copy = (tree.copied() / "growing.bin").read_bytes()
    recorded = tree.manifest()["source_files"]
    assert isinstance(recorded, dict)
    assert recorded["growing.bin"]["size"] == len(copy)  # the size seen at open, copied and recorded
    with open(growing, "rb") as f:
        assert f.read(len(copy)) == copy
    import hashlib

    assert recorded["growing.bin"]["sha256"] == hashlib.sha256(copy).hexdigest()
