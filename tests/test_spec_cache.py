"""The per-user spec cache: a hit gives the same spec without importing pydantic; a content change
misses, a touch or a comment edit does not; a foreign, loose or damaged cache file is a miss."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reconcile.spec import cache as spec_cache
from reconcile.spec.loader import load_spec

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def specs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    shutil.copytree(ROOT / "specs", tmp_path / "specs")
    return tmp_path / "specs"


def _entry() -> Path:
    (entry,) = Path(spec_cache.cache_dir()).iterdir()
    return entry


def test_a_hit_reads_back_the_same_spec(specs: Path) -> None:
    path = str(specs / "blackwell-2x5090.toml")
    first = spec_cache.load(path)
    hit = spec_cache.lookup(path)
    assert hit is not None and type(hit.spec).__name__ == "SpecView"
    assert hit.spec.model_dump() == load_spec(path).spec.model_dump()
    assert hit.sha256 == first.sha256 and hit.files == first.files and hit.resolved == first.resolved
    assert hit.text == first.text and hit.path == path
    assert hit.spec.server is not None and hit.spec.server.args["max-model-len"] == 1048576
    with pytest.raises(AttributeError):
        hit.spec.server.port = 1  # type: ignore[misc]


def test_a_touch_a_rewrite_or_a_comment_edit_of_the_spec_or_its_base_hits(specs: Path) -> None:
    path = specs / "blackwell-2x5090.toml"
    first = spec_cache.load(str(path))
    base = specs / "base.toml"
    os.utime(base, (1, 1))
    text = path.read_text()
    path.unlink()
    path.write_text(text)  # a checkout: a new inode, mtime and ctime
    assert spec_cache.lookup(str(path)) is not None
    edited = "# a new first line\n\n" + text.replace("\n[", "\n  # why the next table\n[", 1) + "\n# last\n"
    path.write_text(edited)
    base.write_text(base.read_text().replace("\n", "   \n", 3) + "\n\n# touched\n")
    hit = spec_cache.lookup(str(path))
    assert hit is not None and hit.sha256 == first.sha256
    assert hit.text == edited  # generations record the text as it is now


def test_a_content_edit_of_the_spec_or_its_base_misses(specs: Path) -> None:
    path = str(specs / "blackwell-2x5090.toml")
    spec_cache.load(path)
    base = specs / "base.toml"
    original = base.read_text()
    base.write_text(original.replace('stop_timeout = "30s"', 'stop_timeout = "31s"'))
    assert spec_cache.lookup(path) is None
    edited = spec_cache.load(path)
    assert edited.spec.server is not None and edited.spec.server.stop_timeout == 31
    assert spec_cache.lookup(path) is not None
    base.write_text(original)
    assert spec_cache.lookup(path) is None


def test_a_hash_inside_a_string_is_content_not_a_comment(specs: Path) -> None:
    path = specs / "spec.toml"
    path.write_text('[machine]\ndescription = "a # b"\n')
    spec_cache.load(str(path))
    path.write_text('[machine]\ndescription = "a # c"\n')
    assert spec_cache.lookup(str(path)) is None
    assert spec_cache.load(str(path)).spec.machine.description == "a # c"


@pytest.mark.parametrize("mode", [0o666, 0o660, 0o604, 0o640])
def test_a_cache_file_others_can_read_or_write_is_never_read(specs: Path, mode: int) -> None:
    path = str(specs / "cpu-demo.toml")
    spec_cache.load(path)
    _entry().chmod(mode)
    assert spec_cache.lookup(path) is None


def test_a_cache_dir_others_can_write_is_never_read(specs: Path) -> None:
    path = str(specs / "cpu-demo.toml")
    spec_cache.load(path)
    Path(spec_cache.cache_dir()).chmod(0o777)
    assert spec_cache.lookup(path) is None
    spec_cache.load(path)  # the next store closes the directory again
    assert Path(spec_cache.cache_dir()).stat().st_mode & 0o777 == 0o700
    assert spec_cache.lookup(path) is not None


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_cache_file_or_dir_of_another_user_is_never_read(specs: Path) -> None:
    path = str(specs / "cpu-demo.toml")
    spec_cache.load(path)
    os.chown(_entry(), 65534, 65534)
    assert spec_cache.lookup(path) is None
    os.chown(_entry(), 0, 0)
    assert spec_cache.lookup(path) is not None
    os.chown(spec_cache.cache_dir(), 65534, 65534)
    assert spec_cache.lookup(path) is None


def test_a_symlinked_cache_file_is_never_followed(specs: Path, tmp_path: Path) -> None:
    path = str(specs / "cpu-demo.toml")
    spec_cache.load(path)
    entry = _entry()
    moved = tmp_path / "elsewhere"
    entry.rename(moved)
    entry.symlink_to(moved)
    assert spec_cache.lookup(path) is None


@pytest.mark.parametrize("body", [b"", b"\x00garbage", b"\xe3\x03\x00\x00\x00", b"N" * 10])
def test_a_damaged_cache_file_is_a_miss_and_is_replaced(specs: Path, body: bytes) -> None:
    path = str(specs / "cpu-demo.toml")
    spec_cache.load(path)
    entry = _entry()
    entry.write_bytes(body)
    assert spec_cache.lookup(path) is None
    assert spec_cache.load(path).spec.server is not None  # a miss, then a full load
    assert spec_cache.lookup(path) is not None


def test_a_cache_of_another_format_is_a_miss(specs: Path) -> None:
    import marshal

    path = str(specs / "cpu-demo.toml")
    spec_cache.load(path)
    entry = _entry()
    head, keys, body, encoded, stamps = marshal.loads(entry.read_bytes())
    entry.write_bytes(marshal.dumps(((0, *head[1:]), keys, body, encoded, stamps)))
    assert spec_cache.lookup(path) is None
    entry.write_bytes(marshal.dumps((head, keys, ("not", "the", "shape"), encoded, stamps)))
    assert spec_cache.lookup(path) is None


def test_the_cache_is_private_whatever_the_umask(specs: Path, tmp_path: Path) -> None:
    code = (
        "import os, sys; os.umask(0); from reconcile.spec import cache as spec_cache; "
        f"spec_cache.load({str(specs / 'cpu-demo.toml')!r})"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "loose")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    directory = tmp_path / "loose" / "reconcile" / "specs"
    assert directory.stat().st_mode & 0o777 == 0o700
    assert [p.stat().st_mode & 0o777 for p in directory.iterdir()] == [0o600]


def test_a_converged_plan_from_the_cache_imports_neither_pydantic_nor_tomlkit(specs: Path) -> None:
    path = str(specs / "blackwell-2x5090.toml")
    spec_cache.load(path)
    code = (
        f"import sys; from reconcile.cli import main; main(['plan', '--spec', {path!r}, '--quiet']); "
        "print(sorted(m for m in ('pydantic', 'tomlkit', 'pickle') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr


def test_an_untouched_file_is_not_lexed_and_an_edit_that_keeps_size_and_mtime_still_misses(
    specs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = specs / "blackwell-2x5090.toml"
    spec_cache.load(str(path))
    with monkeypatch.context() as m:
        m.setattr(spec_cache, "_key", lambda text: pytest.fail("an untouched file was lexed"))
        assert spec_cache.lookup(str(path)) is not None
    base = specs / "base.toml"
    st = base.stat()
    base.write_text(base.read_text().replace('stop_timeout = "30s"', 'stop_timeout = "31s"'))
    os.utime(base, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime: only ctime tells
    assert base.stat().st_size == st.st_size
    assert spec_cache.lookup(str(path)) is None
