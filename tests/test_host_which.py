"""reconcile.host.which answers what shutil.which answers (POSIX), on real files and PATHs."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from reconcile.host import which


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for name, mode in (("a/tool", 0o755), ("b/tool", 0o755), ("c/tool", 0o644), ("d/other", 0o755)):
        path = tmp_path / name
        path.parent.mkdir(exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(mode)
    (tmp_path / "e" / "tool").mkdir(parents=True)  # a directory of that name is never the answer
    return tmp_path


def test_every_kind_of_path_gives_shutils_answer(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dirs = {k: str(tree / k) for k in "abcde"}
    paths = [
        f"{dirs['c']}:{dirs['e']}:{dirs['b']}:{dirs['a']}",
        f"{dirs['a']}:{dirs['a']}:{dirs['b']}",
        f"{dirs['c']}:{dirs['e']}",
        "",
        ":",
        f"{tree / 'missing'}:{dirs['d']}",
    ]
    monkeypatch.chdir(tree / "a")
    for path in paths:
        for name in ("tool", "other", "./tool", str(tree / "c" / "tool"), str(tree / "b" / "tool"), "sh"):
            assert which(name, path=path) == shutil.which(name, path=path), (name, path)
            monkeypatch.setenv("PATH", path)
            assert which(name) == shutil.which(name), (name, path)
    monkeypatch.delenv("PATH")
    assert which("sh") == shutil.which("sh") and os.path.isabs(which("sh") or "")
