"""The spec loader under generated input: valid specs and broken ones, never a traceback.

Every generated spec either loads or fails with one `SpecError` line that starts with `FILE:LINE: ` and
names a line of that file holding the offending key (or its section). Cases come from the real specs
and tests/bad_specs/: their documents mutated (values of every type swapped in, keys dropped or invented,
`{section.key}` references, `extends` chains to a base, a missing file or the spec itself) and their
texts damaged (cut short, bytes inserted, non-UTF-8, a BOM, CRLF). benchmarks/fuzz_spec.py runs the same
cases by the ten thousand and counts them.
"""

from __future__ import annotations

import copy
import datetime
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tomlkit
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from reconcile.errors import SpecError
from reconcile.spec.loader import load_spec

REPO = Path(__file__).resolve().parent.parent
SOURCES = sorted((REPO / "specs").glob("*.toml")) + sorted((REPO / "tests" / "bad_specs").glob("*.toml"))
TEXTS = [p.read_text(encoding="utf-8", errors="replace") for p in SOURCES]


def _document(text: str) -> dict[str, Any] | None:
    try:
        doc: dict[str, Any] = tomlkit.parse(text).unwrap()
    except Exception:
        return None
    doc.pop("extends", None)
    return doc


DOCUMENTS = [d for d in map(_document, TEXTS) if d is not None]


def _resolved(path: Path) -> dict[str, Any] | None:
    try:
        return copy.deepcopy(load_spec(str(path)).resolved)
    except SpecError:
        return None  # specs/base.toml is only a base


# The real specs as the loader resolves them (bases merged): whole, valid documents to mutate.
GOOD_DOCUMENTS = [d for p in SOURCES if p.parent.name == "specs" and (d := _resolved(p)) is not None]
SECTIONS = ["machine", "gpu", "cuda", "apt", "venv", "model", "api_key", "server", "health"]
KEYS = [
    "path",
    "dir",
    "port",
    "name",
    "log",
    "packages",
    "args",
    "env",
    "config",
    "file",
    "mode",
    "count",
    "timeout",
    "running",
    "source",
    "repo",
    "home",
    "target",
    "state_dir",
    "python",
    "host",
    "unknown_key",
]
BASE = "base.toml"


@dataclass(frozen=True)
class Case:
    """Files to write (name -> bytes) and the one to load; `base` is extended by the main file, if any."""

    files: dict[str, bytes]
    main: str = "spec.toml"


_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=12)  # utf-8: no lone surrogates
# fmt: off
PATHS = ["/opt/x", "relative/path", "", "~/x", "/tmp/{spec_dir}", "{spec_dir}/m", "/a/b/../c", "C:\\x",
         "/nul\x00l"]
WORDS = ["10m", "1h30m", "0s", "-5s", "15", "forever", "0600", "600", "0o600", ">=0.26", "*", "==",
         "vllm[all]>=1", "sm_120", "compute_120", "12.0", "580.95", "root", "127.0.0.1"]
JUNK = ['"', "'", "[", "]", "{", "}", "=", "\n", "[[x]]\n", "a = 1\n", "\\", "#", '"""', "\n[server]\n",
        "= =", "\t", "\x00", "\ufeff"]
# fmt: on
_path_like = st.sampled_from(PATHS)
_reference = st.builds(
    lambda a, b: "{" + a + "." + b + "}",
    st.sampled_from([*SECTIONS, "spec_dir", "nope"]),
    st.sampled_from(KEYS),
) | st.sampled_from(["{spec_dir}", "{{model.dir}}", "{", "}{", "{a.}"])
_scalar = (
    st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.sampled_from([0, -1, 1, 65535, 65536, 8000, 2**40])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.booleans()
    | _text
    | _path_like
    | _reference
    | st.sampled_from(WORDS)
    | st.datetimes(min_value=datetime.datetime(1970, 1, 1), max_value=datetime.datetime(2100, 1, 1))
    | st.dates()
)
_value = st.recursive(
    _scalar,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS) | _text, inner, max_size=3)
    ),
    max_leaves=6,
)


def _paths(node: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [at] if at else []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        out += _paths(value, (*at, key))
    return out


def _parent(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path[:-1]:
        doc = doc[key]
    return doc


_name = st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True)


@st.composite
def _benign_document(draw: st.DrawFn) -> dict[str, Any]:
    """A real spec with changes it allows: new flags, env, config keys, packages, a description."""
    doc: dict[str, Any] = copy.deepcopy(draw(st.sampled_from(GOOD_DOCUMENTS)))
    for _ in range(draw(st.integers(0, 5))):
        op = draw(st.sampled_from(["flag", "env", "config", "package", "apt", "description", "drop"]))
        if op == "flag" and "server" in doc:
            flag = st.integers(-(2**31), 2**31) | st.booleans() | _text | st.floats(allow_nan=False)
            doc["server"].setdefault("args", {})[draw(_name)] = draw(flag)
        elif op == "env" and "server" in doc:
            doc["server"].setdefault("env", {})[draw(_name).upper().replace("-", "_")] = draw(_text)
        elif op == "config" and "model" in doc:
            doc["model"].setdefault("config", {})[draw(_name)] = draw(_value)
        elif op == "package" and "venv" in doc:
            version = st.sampled_from(["*", ">=1", "==2.0", "~=1.4", "<3,>=2", "!=1.0"])
            doc["venv"].setdefault("packages", {})[draw(_name)] = draw(version)
        elif op == "apt" and "apt" in doc:
            doc["apt"].setdefault("packages", []).append(draw(_name))
        elif op == "description":
            doc.setdefault("machine", {})["description"] = draw(_text)
        elif op == "drop":
            doc.pop(draw(st.sampled_from(["health", "gpu", "cuda", "apt"])), None)
    return doc


@st.composite
def _mutated_document(draw: st.DrawFn) -> dict[str, Any]:
    # Half from the real specs: mutations of a valid spec reach validation, not only the TOML parser.
    doc: dict[str, Any] = copy.deepcopy(draw(st.sampled_from(GOOD_DOCUMENTS) | st.sampled_from(DOCUMENTS)))
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2, 3, 4]))):
        paths = _paths(doc)
        op = draw(st.sampled_from(["replace", "replace", "delete", "add", "section", "reference"]))
        if op == "section" or not paths:
            section = st.dictionaries(st.sampled_from(KEYS), _value, max_size=4)
            doc[draw(st.sampled_from([*SECTIONS, "bogus"]))] = draw(section | section | section | _scalar)
            continue
        path = draw(st.sampled_from(paths))
        parent = _parent(doc, path)
        if op == "delete":
            del parent[path[-1]]
        elif op == "add" and isinstance(parent, dict):
            parent[draw(st.sampled_from(KEYS) | _text)] = draw(_value)
        elif op == "reference":
            parent[path[-1]] = draw(_reference)
        else:
            parent[path[-1]] = draw(_value)
    return doc


def _dumps(doc: dict[str, Any]) -> str | None:
    try:
        return tomlkit.dumps(doc)
    except Exception:  # a value tomlkit cannot write (e.g. a mixed-type nested structure): not a case
        return None


@st.composite
def _damaged(draw: st.DrawFn, text: str) -> bytes:
    data = text.encode("utf-8")
    how = draw(st.sampled_from(["none"] * 6 + ["cut", "insert", "flip", "bom", "crlf", "latin1"]))
    at = draw(st.integers(0, len(data)))
    if how == "cut":
        return data[:at]
    if how == "insert":
        junk = draw(st.sampled_from(JUNK))
        return data[:at] + junk.encode() + data[at:]
    if how == "flip":
        return data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1 :]
    if how == "bom":
        return b"\xef\xbb\xbf" + data
    if how == "crlf":
        return data.replace(b"\n", b"\r\n")
    if how == "latin1":
        return data[:at] + "é".encode("latin-1") + data[at:]
    return data


@st.composite
def spec_cases(draw: st.DrawFn) -> Case:
    """One generated spec: a mutated document, a damaged real text, or noise; sometimes with a base."""
    kind = draw(st.sampled_from(["document", "document", "document", "text", "noise"]))
    if kind == "document":
        text = _dumps(draw(_mutated_document() | _benign_document()))
        assume(text is not None)
        assert text is not None
    elif kind == "text":
        text = draw(st.sampled_from(TEXTS))
    else:
        text = draw(st.text(alphabet="abcdefg_.=[]{}\"'#\n 0123456789-+:,", max_size=200))
    chain = draw(
        st.sampled_from(["none"] * 5 + ["base"] * 2 + ["base-damaged", "missing", "self", "cycle", "bad"])
    )
    if chain == "none":
        return Case({"spec.toml": draw(_damaged(text))})
    if chain in ("base", "base-damaged"):
        override = _dumps(draw(_mutated_document())) or ""
        machine = f'extends = "{BASE}"\n' + override
        base = text.encode() if chain == "base" else draw(_damaged(text))
        return Case({"spec.toml": draw(_damaged(machine)), BASE: base})
    target = {"missing": "nowhere.toml", "self": "spec.toml", "cycle": BASE, "bad": ""}[chain]
    files = {"spec.toml": draw(_damaged(f'extends = "{target}"\n' + text))}
    if chain == "cycle":
        files[BASE] = b'extends = "spec.toml"\n'
    return Case(files)


def check_case(directory: Path, case: Case) -> str:
    """Load the case: "valid", or "rejected" with a proper one-line error; anything else fails the test."""
    for name in os.listdir(directory):
        os.unlink(directory / name)
    for name, data in case.files.items():
        (directory / name).write_bytes(data)
    main = str(directory / case.main)
    try:
        load_spec(main)
    except SpecError as err:
        message = str(err)
        assert "\n" not in message and "\r" not in message, f"more than one line: {message!r}"
        assert err.line is not None, f"no line number: {message!r}"
        assert message.startswith(f"{err.file}:{err.line}: "), message
        assert "Traceback" not in message and "Input should" not in message, message
        lines = Path(err.file).read_bytes().decode("utf-8", errors="replace").splitlines()
        assert 1 <= err.line <= max(len(lines), 1), f"line {err.line} of {len(lines)}: {message!r}"
        return "rejected"
    return "valid"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


SEEN: dict[str, int] = {"valid": 0, "rejected": 0}
SETTINGS = settings(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)


@settings(SETTINGS, max_examples=1500)
@given(case=spec_cases())
def test_a_generated_spec_loads_or_fails_with_one_line_naming_its_file_and_line(
    workdir: Path, case: Case
) -> None:
    SEEN[check_case(workdir, case)] += 1


def test_the_generated_specs_mix_valid_and_broken_ones(workdir: Path) -> None:
    if not sum(SEEN.values()):  # run alone (or on another xdist worker): count a run of its own

        @settings(SETTINGS, max_examples=300)
        @given(case=spec_cases())
        def count(case: Case) -> None:
            SEEN[check_case(workdir, case)] += 1

        count()
    # A generator that only ever made syntax errors, or never broke anything, would prove little.
    total = sum(SEEN.values())
    assert SEEN["valid"] >= total // 10 and SEEN["rejected"] >= total // 2, SEEN


@settings(SETTINGS, max_examples=10)
@given(case=spec_cases())
def test_the_cli_reports_a_generated_broken_spec_in_one_line_and_exits_1(workdir: Path, case: Case) -> None:
    assume(check_case(workdir, case) == "rejected")
    proc = subprocess.run(
        [sys.executable, "-m", "reconcile", "plan", "--spec", str(workdir / case.main)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "XDG_CACHE_HOME": str(workdir.parent / "cache")},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert re.match(rf"reconcile: {re.escape(str(workdir))}/[^:]+\.toml:\d+: ", proc.stderr), proc.stderr
