"""Attacks on the per-user caches root reads on every timer tick (review of issue 18b): a cache root in a
tree another user can change (sudo -E keeps XDG_CACHE_HOME), a symlink on the way to it, a corrupt entry."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from probes import venv
from reconcile import private_cache
from reconcile.spec import cache as spec_cache

ROOT = Path(__file__).resolve().parent.parent
NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="another user's tree needs root to chown")


def _users_tree(tmp_path: Path) -> Path:
    """A home's .cache that user `nobody` owns (made for it by root, as useradd would)."""
    home = tmp_path / "home"
    (home / ".cache").mkdir(parents=True)
    os.chown(home, NOBODY, NOBODY)
    os.chown(home / ".cache", NOBODY, NOBODY)
    return home / ".cache"


def _site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    (site / "tiny-1.0.dist-info").mkdir(parents=True)
    (site / "tiny-1.0.dist-info" / "METADATA").write_text("Name: tiny\nVersion: 1.0\n\n")
    return site


@as_root
def test_root_follows_no_symlink_another_user_put_on_the_way_to_its_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sudo -E reconcile plan`: the user's XDG_CACHE_HOME reaches root. The user points
    $XDG_CACHE_HOME/reconcile at a system directory; root must not make dirs, write files or chmod
    there (before the fix it turned the root-owned 0755 `victim/venv` into 0700 and wrote into it)."""
    cache = _users_tree(tmp_path)
    victim = tmp_path / "victim"
    (victim / "venv").mkdir(parents=True)  # e.g. /opt/vllm/venv, served by a non-root user
    os.chmod(victim, 0o755)
    os.chmod(victim / "venv", 0o755)
    (cache / "reconcile").symlink_to(victim)
    os.chown(cache / "reconcile", NOBODY, NOBODY, follow_symlinks=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))

    venv.scan_site_packages(str(_site(tmp_path)))  # remembers the METADATA headers in <root>/venv
    shutil.copytree(ROOT / "specs", tmp_path / "specs")
    spec_cache.load(str(tmp_path / "specs" / "cpu-demo.toml"))  # <root>/specs

    assert stat.S_IMODE(os.stat(victim / "venv").st_mode) == 0o755
    assert sorted(p.name for p in victim.iterdir()) == ["venv"]
    assert list((victim / "venv").iterdir()) == []


@as_root
def test_root_keeps_no_cache_in_a_tree_another_user_can_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A root-owned 0700 dir inside a directory the user owns is still the user's to rename and
    replace between root's check and root's use (and chmod follows a symlink put there): root must
    not cache under another user's directory at all."""
    cache = _users_tree(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    shutil.copytree(ROOT / "specs", tmp_path / "specs")
    spec_cache.load(str(tmp_path / "specs" / "cpu-demo.toml"))
    venv.scan_site_packages(str(_site(tmp_path)))
    assert list(cache.iterdir()) == []


@pytest.mark.parametrize("cut", [0, 1, 2, 5, 17, -9, -2, -1])
def test_a_truncated_entry_of_every_cache_is_a_clean_miss_and_is_rewritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut: int
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    shutil.copytree(ROOT / "specs", tmp_path / "specs")
    path = str(tmp_path / "specs" / "cpu-demo.toml")
    first = spec_cache.load(path)
    (entry,) = Path(spec_cache.cache_dir()).iterdir()
    body = entry.read_bytes()
    entry.write_bytes(body[:cut] if cut >= 0 else body[:cut] + b"\xff")
    assert private_cache.read(str(entry)) is None or spec_cache.lookup(path) is None or cut < 0
    again = spec_cache.load(path)  # no traceback, and the next run is a hit again
    assert again.sha256 == first.sha256
    assert spec_cache.lookup(path) is not None


def test_every_level_root_makes_for_its_cache_is_0700_whatever_the_umask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """makedirs gives only the last level its mode: under umask 0 $XDG_CACHE_HOME/reconcile was 0777,
    so any user could rename root's specs/ in it and put a symlink there for root's next chmod."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    shutil.copytree(ROOT / "specs", tmp_path / "specs")
    old = os.umask(0)
    try:
        spec_cache.load(str(tmp_path / "specs" / "cpu-demo.toml"))
    finally:
        os.umask(old)
    for level in (tmp_path / "cache", tmp_path / "cache" / "reconcile", Path(spec_cache.cache_dir())):
        assert stat.S_IMODE(level.stat().st_mode) == 0o700, level
    assert spec_cache.lookup(str(tmp_path / "specs" / "cpu-demo.toml")) is not None


def test_a_spec_cached_by_an_older_reconcile_is_validated_by_the_new_one(tmp_path: Path) -> None:
    """An upgrade in place (git pull + pip install: __version__ stays 0.1.0) that adds a check must
    apply it to the spec the timer loads from the cache; the hit skipped validation altogether. Here
    the new release allows only ports up to 1023 (a stand-in for any new safety check)."""
    code = tmp_path / "code"
    shutil.copytree(ROOT / "reconcile", code / "reconcile", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "specs", tmp_path / "specs")
    run = [sys.executable, "-c", "import sys; from reconcile.spec import cache; cache.load(sys.argv[1])"]
    run.append(str(tmp_path / "specs" / "cpu-demo.toml"))
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    assert subprocess.run(run, cwd=code, env=env, capture_output=True, text=True).returncode == 0
    models = code / "reconcile" / "spec" / "models.py"
    text = models.read_text()
    assert "Field(ge=1, le=65535)" in text
    models.write_text(text.replace("Field(ge=1, le=65535)", "Field(ge=1, le=1023)"))
    done = subprocess.run(run, cwd=code, env=env, capture_output=True, text=True)
    assert done.returncode != 0 and "SpecError" in done.stderr, done.stderr


def test_no_cache_keeps_a_secret_the_spec_holds_inline(tmp_path: Path) -> None:
    """A sensitive [server] env value is kept only as a hash at rest (generations, launch records);
    the spec cache (its resolved document) and the preflight memo (its key spells the spec) kept it in
    clear, and kept it after the operator moved it to secret_files."""
    specs = tmp_path / "specs"
    shutil.copytree(ROOT / "specs", specs)
    # The demo's executable, `{spec_dir}/../tests/fakes/vllm`: the plan refuses one that is not there.
    shutil.copytree(ROOT / "tests" / "fakes", tmp_path / "tests" / "fakes")
    demo = specs / "cpu-demo.toml"
    text = demo.read_text()
    assert 'env = { HF_HUB_OFFLINE = "1"' in text
    demo.write_text(
        text.replace(
            'env = { HF_HUB_OFFLINE = "1"', 'env = { HF_TOKEN = "hf_TopSecret42", HF_HUB_OFFLINE = "1"'
        )
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    reconcile = [sys.executable, "-m", "reconcile", "plan", "--spec", str(demo)]
    for _ in range(2):
        done = subprocess.run(reconcile, env=env, capture_output=True, text=True)
        assert done.returncode in (0, 2), done.stderr
        assert "hf_TopSecret42" not in done.stdout
    kept = [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and b"hf_TopSecret42" in p.read_bytes()]
    assert kept == []
