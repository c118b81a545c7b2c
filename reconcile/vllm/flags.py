"""Which `vllm serve` flags exist in which vLLM release (reconcile/data/vllm_flags.json).

Used by the preflight's flags rules and by anyone rendering a command line. The table is read
on first use, not at import: `reconcile plan` must start fast.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache

from reconcile.record import Record

# A str, not a pathlib.Path: pathlib (with urllib.parse and ipaddress) costs ~5-9 ms to import.
TABLE_PATH = os.path.join(
    os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "data", "vllm_flags.json"
)

# Short forms vLLM's parser accepts beside the long names (vllm/engine/arg_utils.py).
ALIASES: Mapping[str, str] = {
    "-tp": "--tensor-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-dp": "--data-parallel-size",
    "-dpl": "--data-parallel-size-local",
    "-dcp": "--decode-context-parallel-size",
    "-pcp": "--prefill-context-parallel-size",
    "-ep": "--enable-expert-parallel",
    "-q": "--quantization",
    "-O": "--compilation-config",
}

_RELEASE = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?")
Release = tuple[int, int, int]


class FlagTable(Record):
    versions: tuple[str, ...]  # listed releases, oldest first
    runs: Mapping[str, tuple[tuple[str, str], ...]]  # flag -> runs of (first, last) listed release


@lru_cache(maxsize=1)
def table() -> FlagTable:
    with open(TABLE_PATH, encoding="utf-8") as f:
        data = json.load(f)
    runs = {flag: tuple((r[0], r[1]) for r in spans) for flag, spans in data["flags"].items()}
    return FlagTable(tuple(data["versions"]), runs)


def release(version: str) -> Release | None:
    """The release a version string belongs to: "0.26.0rc1" -> (0, 26, 0), "0.26.1.dev5+g1a2b" -> (0, 26, 1).

    A release candidate or a dev build of 0.26.0 is treated as 0.26.0, not as "before 0.26.0":
    the flags of a release are fixed by its first rc, and nightlies (the reference article ran
    0.26.0rc1) already carry the removals of the release they lead to.
    """
    m = _RELEASE.match(version)
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def _key(listed: str) -> Release:
    rel = release(listed)
    assert rel is not None
    return rel


def canonical(flag: str) -> str:
    """`-tp` -> `--tensor-parallel-size`; `max_model_len` / `max-model-len` -> `--max-model-len`."""
    flag = flag.strip()
    if flag in ALIASES:
        return ALIASES[flag]
    if flag.startswith("--"):
        return "--" + flag[2:].replace("_", "-")
    if flag.startswith("-") and len(flag) > 1:
        return ALIASES.get(flag, flag)
    return "--" + flag.replace("_", "-")


def _lookup(flag: str) -> str | None:
    """The table's name for a flag, or None when no listed release has it (a `--no-x` form maps to `--x`)."""
    name = canonical(flag)
    runs = table().runs
    if name in runs:
        return name
    if name.startswith("--no-") and "--" + name[5:] in runs:
        return "--" + name[5:]
    return None


def _present_in(runs: Sequence[tuple[str, str]], listed: str) -> bool:
    key = _key(listed)
    return any(_key(first) <= key <= _key(last) for first, last in runs)


def flag_exists(flag: str, version: str) -> bool | None:
    """Whether `vllm serve` of `version` accepts `flag`; None when the table cannot say.

    The version is mapped to the listed release at or below it. Between two listed releases
    that disagree (the lists skip 0.21-0.24 and 0.31-0.32) the answer is None, not a guess.
    Past the newest list, a flag present there is assumed kept and a removed one stays removed;
    a flag no list has is None there (it may be new) and False inside the listed range.
    """
    rel = release(version)
    t = table()
    if rel is None or rel < _key(t.versions[0]):
        return None
    name = _lookup(flag)
    below = [v for v in t.versions if _key(v) <= rel]
    above = [v for v in t.versions if _key(v) > rel]
    floor = below[-1]
    if name is None:
        return None if not above and rel > _key(floor) else False
    runs = t.runs[name]
    at_floor = _present_in(runs, floor)
    if _key(floor) == rel or not above:
        return at_floor
    return at_floor if _present_in(runs, above[0]) == at_floor else None


def flag_history(flag: str) -> tuple[str | None, str | None]:
    """(added_in, removed_in) as listed releases; (None, None) for a flag no list has.

    added_in "0.10.0" means "in the oldest list" (it may be older). removed_in is the first
    listed release after the last one that has it (None while the newest list has it); across a
    gap in the lists it is "by" that release. Gaps inside a flag's life are ignored here.
    """
    name = _lookup(flag)
    if name is None:
        return None, None
    runs = table().runs[name]
    versions = table().versions
    last = runs[-1][1]
    later = [v for v in versions if _key(v) > _key(last)]
    return runs[0][0], (later[0] if later else None)


def listed_versions() -> tuple[str, ...]:
    return table().versions


def version_from_pin(specifier: str) -> str | None:
    """The version a pip specifier most plainly names: "==0.26.0" -> "0.26.0", ">=0.26.0rc1" -> "0.26.0rc1".

    For `>=`/`~=` this is the lowest version pip may pick: a guess the preflight labels "spec pin".
    """
    for clause in specifier.split(","):
        m = re.match(r"^\s*(===|==|~=|>=)\s*([0-9][0-9A-Za-z.+!-]*)\s*\Z", clause)
        if m and "*" not in m.group(2):
            return m.group(2)
    return None
