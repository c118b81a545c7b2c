"""The loader parses with tomllib where it can and tomlkit where tomllib refuses: the same documents.

tomllib (3.11+) is ~30x faster to parse and to import than tomlkit, but refuses what tomlkit
accepts beyond TOML 1.0 (a multi-line inline table). Whatever tomllib
accepts must read the same through tomlkit, order and types included, and every spec must load
to the same validated result either way.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import tomlkit
from hypothesis import HealthCheck, given, settings

from reconcile.spec import loader as loading
from tests.test_fuzz_spec import Case, spec_cases

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib is 3.11+")
REPO = Path(__file__).resolve().parent.parent
SPECS = [p for p in sorted((REPO / "specs").glob("*.toml")) if p.name != "base.toml"]


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(spec_cases())
def test_what_tomllib_accepts_tomlkit_reads_the_same(case: Case) -> None:
    for data in case.files.values():
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            continue
        fast = loading._standard_toml(text)
        if fast is not None:
            assert repr(tomlkit.parse(text).unwrap()) == repr(fast)  # repr: order, types and nan


@pytest.mark.parametrize("path", SPECS, ids=[p.name for p in SPECS])
def test_every_spec_loads_the_same_through_either_parser(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fast = loading.load_spec(str(path))
    monkeypatch.setattr(loading, "_standard_toml", lambda text: None)
    slow = loading.load_spec(str(path))
    assert repr(fast.resolved) == repr(slow.resolved) and fast.sha256 == slow.sha256
    assert fast.spec.model_dump() == slow.spec.model_dump()


def test_a_multi_line_inline_table_is_left_to_tomlkit(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text('[venv]\npath = "/tmp/v"\npackages = { ninja = "*",\n             uv = ">=0.4" }\n')
    assert loading._standard_toml(spec.read_text()) is None  # TOML 1.1: tomllib refuses it
    venv = loading.load_spec(str(spec)).spec.venv
    assert venv is not None and venv.packages == {"ninja": "*", "uv": ">=0.4"}


def test_the_bundled_specs_are_standard_toml() -> None:
    for path in sorted((REPO / "specs").glob("*.toml")):
        assert loading._standard_toml(path.read_text()) is not None, path  # no tomlkit on their cold load
