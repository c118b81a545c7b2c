"""The spec's git commit in plan and apply, and the warning on uncommitted changes, in a real repo."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from reconcile.cli import main
from reconcile.plan.planner import make_plan
from reconcile.spec.loader import load_spec
from reconcile.spec.origin import GitInfo, git_info

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


@pytest.fixture(autouse=True)
def isolated_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No ~/.gitconfig or /etc/gitconfig of this machine; an author for the commits."""
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", "/dev/null")
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for key in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{key}_NAME", "Fleet Bot")
        monkeypatch.setenv(f"GIT_{key}_EMAIL", "fleet@example.invalid")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def fleet_repo(root: Path) -> tuple[Path, Path, str]:
    """specs/base.toml and specs/box.toml (extends the base), committed."""
    specs = root / "repo" / "specs"
    specs.mkdir(parents=True)
    (specs / "base.toml").write_text('[health]\ntimeout = "5s"\n')
    box = specs / "box.toml"
    box.write_text(
        f'extends = "base.toml"\n\n[machine]\nstate_dir = "{root / "state"}"\n\n'
        f'[api_key]\nfile = "{root / "key"}"\n'
    )
    git(specs.parent, "init", "-q")
    git(specs.parent, "add", "specs")
    git(specs.parent, "commit", "-q", "-m", "fleet")
    return specs.parent, box, git(specs.parent, "rev-parse", "HEAD")


def test_plan_names_the_commit_of_a_clean_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, box, sha = fleet_repo(tmp_path)

    plan = make_plan(load_spec(str(box)))

    assert plan.git == f"git {sha[:12]}"
    assert not any("uncommitted" in n for n in plan.notes)
    assert main(["plan", "--spec", str(box)]) == 2
    assert f"· git {sha[:12]}\n" in capsys.readouterr().out


def test_an_edited_base_file_counts_as_uncommitted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, box, sha = fleet_repo(tmp_path)
    base = box.parent / "base.toml"
    base.write_text(base.read_text().replace('"5s"', '"7s"'))

    plan = make_plan(load_spec(str(box)))

    assert plan.git == f"git {sha[:12]} (uncommitted changes)"
    assert [n for n in plan.notes if "uncommitted" in n] == [
        f"{box} has uncommitted changes (plan reflects the file, not {sha[:12]})"
    ]
    assert main(["plan", "--spec", str(box)]) == 2
    assert "has uncommitted changes" in capsys.readouterr().out


def test_a_new_untracked_spec_counts_as_uncommitted(tmp_path: Path) -> None:
    _, box, sha = fleet_repo(tmp_path)
    other = box.parent / "other.toml"
    other.write_text(box.read_text())

    info = git_info((str(other), str(box.parent / "base.toml")))

    assert info.commit == sha and info.dirty is True
    assert git_info((str(box),)).dirty is False


def test_outside_a_repository_plan_says_not_in_git(tmp_path: Path) -> None:
    (tmp_path / "solo.toml").write_text(f'[machine]\nstate_dir = "{tmp_path / "state"}"\n')

    plan = make_plan(load_spec(str(tmp_path / "solo.toml")))

    assert plan.git == "not in git" and not any("uncommitted" in n for n in plan.notes)


def test_apply_records_the_commit_in_its_generation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, box, sha = fleet_repo(tmp_path)

    assert main(["apply", "--spec", str(box)]) == 2

    generation = json.loads((tmp_path / "state" / "generations" / "1.json").read_text())
    assert generation["git_commit"] == sha and generation["git_dirty"] is False
    assert f"git {sha[:12]}" in capsys.readouterr().out
    assert json.loads((tmp_path / "state" / "last-run.json").read_text())["git"] == f"git {sha[:12]}"


def test_apply_warns_on_uncommitted_changes_and_records_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, box, sha = fleet_repo(tmp_path)
    box.write_text(box.read_text() + "\n[health]\ncheck_models = false\n")

    assert main(["apply", "--spec", str(box)]) == 2

    out = capsys.readouterr().out
    assert f"git {sha[:12]} (uncommitted changes)" in out and "has uncommitted changes" in out
    generation = json.loads((tmp_path / "state" / "generations" / "1.json").read_text())
    assert generation["git_commit"] == sha and generation["git_dirty"] is True


def test_a_base_outside_the_repository_keeps_the_commit_and_a_repository_without_one_is_not_in_git(
    tmp_path: Path,
) -> None:
    """git status refuses a path outside the work tree (exit 128): the commit is still the spec's
    repository's, as `git rev-parse HEAD` says; a repository with no commit yet is "not in git"."""
    _, box, sha = fleet_repo(tmp_path)
    outside = tmp_path / "outside.toml"
    outside.write_text('[health]\ntimeout = "5s"\n')
    assert git_info((str(box), str(outside))) == GitInfo(sha, False)
    empty = tmp_path / "empty"
    empty.mkdir()
    git(empty, "init", "-q")
    (empty / "box.toml").write_text("")
    assert git_info((str(empty / "box.toml"),)) == GitInfo(None, None)
    assert git_info((str(empty / "box.toml"),)).describe() == "not in git"
