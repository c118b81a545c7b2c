"""Review of issue 18b's git cache: inputs git reads for the spec's state that the cache's key omits."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.test_git_cache import agrees, git, repo  # noqa: F401  (repo: the fixture)

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def test_a_gitignore_beside_a_base_spec_in_another_directory_is_watched(repo: Path) -> None:  # noqa: F811
    """`extends = "../common/base.toml"`: the walk up watches the .gitignore files above the spec,
    not the one beside its base, so ignoring the untracked base left the plan saying dirty."""
    common = repo / "common"
    common.mkdir()
    base = common / "base.toml"
    base.write_text('[health]\ntimeout = "5s"\n')
    os.utime(base, (1_000_000_000, 1_000_000_000))
    box = repo / "specs" / "box.toml"
    assert agrees(box, base).dirty is True  # the base is untracked
    (common / ".gitignore").write_text("base.toml\n")
    assert agrees(box, base).dirty is False


def test_a_custom_core_excludesfile_is_watched(repo: Path, tmp_path: Path) -> None:  # noqa: F811
    """core.excludesFile may name any file; only $XDG_CONFIG_HOME/git/ignore was watched."""
    ignore = tmp_path / "my-ignores"
    ignore.write_text("")
    git(repo, "config", "core.excludesFile", str(ignore))
    extra = repo / "specs" / "extra.toml"
    extra.write_text('[health]\ntimeout = "5s"\n')
    os.utime(extra, (1_000_000_000, 1_000_000_000))
    assert agrees(extra).dirty is True
    ignore.write_text("extra.toml\n")
    assert agrees(extra).dirty is False
