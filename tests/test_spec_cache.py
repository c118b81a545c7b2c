"""The per-user spec cache: a hit gives the same spec without importing pydantic; any change misses."""

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


def test_a_hit_reads_back_the_same_spec(specs: Path) -> None:
    path = str(specs / "blackwell-2x5090.toml")
    first = spec_cache.load(path)
    hit = spec_cache.lookup(path)
    assert hit is not None and type(hit.spec).__name__ == "SpecView"
    assert hit.spec.model_dump() == load_spec(path).spec.model_dump()
    assert hit.sha256 == first.sha256 and hit.files == first.files
    assert hit.spec.server is not None and hit.spec.server.args["max-model-len"] == 1048576
    with pytest.raises(AttributeError):
        hit.spec.server.port = 1  # type: ignore[misc]


def test_editing_the_spec_or_its_base_misses(specs: Path) -> None:
    path = str(specs / "blackwell-2x5090.toml")
    spec_cache.load(path)
    base = specs / "base.toml"
    base.write_text(base.read_text() + "\n# touched\n")
    assert spec_cache.lookup(path) is None
    spec_cache.load(path)
    assert spec_cache.lookup(path) is not None


def test_a_cache_file_others_can_write_is_never_unpickled(specs: Path) -> None:
    path = str(specs / "cpu-demo.toml")
    spec_cache.load(path)
    entry = next(Path(spec_cache.cache_dir()).iterdir())
    entry.chmod(0o666)
    assert spec_cache.lookup(path) is None


def test_a_converged_plan_from_the_cache_imports_neither_pydantic_nor_tomlkit(specs: Path) -> None:
    path = str(specs / "blackwell-2x5090.toml")
    spec_cache.load(path)
    code = (
        f"import sys; from reconcile.cli import main; main(['plan', '--spec', {path!r}, '--quiet']); "
        "print(sorted(m for m in ('pydantic', 'tomlkit') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr
