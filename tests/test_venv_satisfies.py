"""resources.venv: whether an installed version satisfies a requirement, remembered across runs,
is packaging's own answer; a remembered answer needs no packaging import; a damaged file is a miss."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

PAIRS = [
    ("1.1.1", "==1.1.1"),
    ("1.1.1+local", "==1.1.1"),
    ("2.0", ">=1.0,<2"),
    ("1.5rc1", ">=1.0,<2"),
    ("0.26.0", "~=0.26.0"),
    ("0.27.0", "~=0.26.0"),
    ("not a version", ">=1"),
    ("1.0", "!=1.0"),
    ("3", ">2.9"),
]


def _packaging(version: str, spec: str) -> bool:
    try:
        return SpecifierSet(spec, prereleases=True).contains(Version(version))
    except InvalidVersion:
        return False


def _run(code: str, home: Path) -> str:
    env = {**os.environ, "XDG_CACHE_HOME": str(home)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


CODE = (  # as the planners do: every package asked, then the answers saved
    "import sys; from reconcile.resources.venv import _answers, _satisfies; "
    f"print([_satisfies(v, s) for v, s in {PAIRS!r}], 'packaging' in sys.modules); _answers().save()"
)


def test_remembered_answers_are_packagings_and_need_no_packaging(tmp_path: Path) -> None:
    expected = str([_packaging(v, s) for v, s in PAIRS])
    assert _run(CODE, tmp_path) == f"{expected} True"  # the first run asks packaging
    assert _run(CODE, tmp_path) == f"{expected} False"  # then the answers are remembered
    (tmp_path / "reconcile" / "satisfies.marshal").write_bytes(b"\x00damaged")
    assert _run(CODE, tmp_path) == f"{expected} True"


def test_a_bad_specifier_still_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from packaging.specifiers import InvalidSpecifier

    from reconcile.resources import venv

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(InvalidSpecifier):
        venv._satisfies("1.0", "=>1")
