"""reconcile.spec.git_cache: the spec's git state from the cache equals git's own answer after every
kind of change (edit, stage, commit, branch switch, untracked, ignored, no repository), and a
hit starts no process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reconcile.spec.origin import GitInfo, ask_git, git_info

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in [n for n in os.environ if n.startswith("GIT_")]:
        monkeypatch.delenv(name)  # any GIT_* variable turns the cache off
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tmp_path / "repo"
    (root / "specs").mkdir(parents=True)
    (root / "specs" / "base.toml").write_text('[health]\ntimeout = "5s"\n')
    (root / "specs" / "box.toml").write_text('extends = "base.toml"\n')
    # Older than the index, or git finds them "racily clean" and rewrites its index on every status
    # for a second (the cache then keeps nothing, rightly: what it watches keeps changing).
    for spec in (root / "specs").iterdir():
        os.utime(spec, (1_000_000_000, 1_000_000_000))
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "specs")
    git(root, "commit", "-q", "-m", "fleet")
    return root


def git(root: Path, *args: str) -> str:
    argv = ["git", "-C", str(root), "-c", "user.name=Fleet", "-c", "user.email=f@example.invalid", *args]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


def agrees(*paths: Path) -> GitInfo:
    """git_info twice (the second from the cache when nothing moved) against git itself."""
    files = tuple(map(str, paths))
    first, second, truth = git_info(files), git_info(files), GitInfo(*ask_git(files))
    assert first == truth and second == truth
    return truth


def test_the_cached_state_follows_every_change_git_sees(repo: Path) -> None:
    box, base = repo / "specs" / "box.toml", repo / "specs" / "base.toml"
    first = agrees(box, base)
    assert first.commit == git(repo, "rev-parse", "HEAD") and first.dirty is False
    base.write_text(base.read_text() + "# edited\n")
    assert agrees(box, base).dirty is True
    git(repo, "add", "specs")
    assert agrees(box, base).dirty is True  # staged, not committed
    git(repo, "commit", "-q", "-m", "edit")
    second = agrees(box, base)
    assert second.dirty is False and second.commit != first.commit
    git(repo, "checkout", "-q", "-b", "other", first.commit or "")
    assert agrees(box, base) == GitInfo(first.commit, False)
    git(repo, "checkout", "-q", "main")
    assert agrees(box, base) == GitInfo(second.commit, False)
    git(repo, "pack-refs", "--all")  # the branch now lives in packed-refs only
    assert agrees(box, base) == GitInfo(second.commit, False)


def test_untracked_ignored_and_outside_any_repository(repo: Path) -> None:
    new = repo / "specs" / "new.toml"
    new.write_text("")
    assert agrees(new).dirty is True
    (repo / "specs" / ".gitignore").write_text("new.toml\n")
    assert agrees(new).dirty is False
    shutil.rmtree(repo / ".git")
    assert agrees(new) == GitInfo(None, None)
    git(repo, "init", "-q")
    assert agrees(new).commit is None  # a repository with no commit yet


def test_a_hit_starts_no_process(repo: Path, tmp_path: Path) -> None:
    box = repo / "specs" / "box.toml"
    code = f"from reconcile.spec.origin import git_info; print(git_info(({str(box)!r},)).describe())"
    outputs, execs = [], []
    for n in range(2):
        trace = tmp_path / f"trace{n}"
        done = subprocess.run(
            ["strace", "-f", "-qq", "-e", "trace=execve", "-o", str(trace), sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
        )
        outputs.append(done.stdout.strip())
        execs.append([ln for ln in trace.read_text().splitlines() if "execve(" in ln])
    assert outputs[0] == outputs[1] == f"git {git(repo, 'rev-parse', 'HEAD')[:12]}"
    assert len(execs[0]) > 1 and len(execs[1]) == 1, execs  # git ran once; then only the interpreter


def test_a_git_variable_in_the_environment_turns_the_cache_off(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    box = repo / "specs" / "box.toml"
    agrees(box)
    monkeypatch.setenv("GIT_DIR", str(repo / "nowhere"))
    assert git_info((str(box),)) == GitInfo(None, None) == GitInfo(*ask_git((str(box),)))


def test_a_git_directory_made_above_a_spec_outside_git_is_seen(repo: Path, tmp_path: Path) -> None:
    outside = tmp_path / "plain" / "specs" / "box.toml"
    outside.parent.mkdir(parents=True)
    outside.write_text("")
    assert agrees(outside) == GitInfo(None, None)
    git(tmp_path / "plain", "init", "-q", "-b", "main")
    git(tmp_path / "plain", "add", ".")
    git(tmp_path / "plain", "commit", "-q", "-m", "now in git")
    assert agrees(outside).commit == git(tmp_path / "plain", "rev-parse", "HEAD")
