"""Shapes of JSON documents, checked in plain Python (no pydantic on the warm path): every field's
type, `"server.since" is null, expected a number` when one is wrong. Used by
reconcile.safety.statefiles, where each state file's shape is written down beside its reader.
"""

from __future__ import annotations

import json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import TypeGuard


class Shape:
    """What a JSON value must be. Subclasses check one kind; `problem` says what is wrong, or None."""

    def problem(self, value: object, where: str) -> str | None:
        raise NotImplementedError


def _name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, (dict, list, str)):
        return {dict: "an object", list: "a list", str: "a string"}[type(value)]
    return f"{type(value).__name__} {json.dumps(value)[:40]}"


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


class Scalar(Shape):
    def __init__(
        self, kind: str, *, nullable: bool = False, minimum: float | None = None, maximum: float | None = None
    ) -> None:
        self.kind, self.nullable, self.minimum, self.maximum = kind, nullable, minimum, maximum

    def problem(self, value: object, where: str) -> str | None:
        if value is None and self.nullable:
            return None
        ok = {
            "string": type(value) is str,
            "integer": type(value) is int,  # a bool is not a count
            # finite: x - x is 0 for every number but inf and nan (math itself is not on the warm path)
            "number": type(value) in (int, float) and value - value == 0,  # type: ignore[operator]
            "boolean": type(value) is bool,
        }[self.kind]
        if ok and self.minimum is not None and value < self.minimum:  # type: ignore[operator]
            ok = False
        if ok and self.maximum is not None and value > self.maximum:  # type: ignore[operator]
            ok = False
        if ok:
            return None
        bound = f" >= {self.minimum:g}" if self.minimum is not None else ""
        bound += f" <= {self.maximum:g}" if self.maximum is not None else ""
        return (
            f'"{where}" is {_name(value)}, expected {"an" if self.kind[0] == "i" else "a"} {self.kind}{bound}'
        )


class Const(Shape):
    def __init__(self, value: str) -> None:
        self.value = value

    def problem(self, value: object, where: str) -> str | None:
        return None if value == self.value else f'"{where}" is not "{self.value}"'


class Matching(Shape):
    """A string that matches `pattern` whole (re.fullmatch): a value that becomes a command's argument
    or a requirement line (a lock's version, a commit), not just any string."""

    def __init__(self, pattern: str, what: str) -> None:
        self.pattern, self.what = pattern, what

    def problem(self, value: object, where: str) -> str | None:
        import re

        if type(value) is str and re.fullmatch(self.pattern, value):
            return None
        return f'"{where}" is {_name(value)}, expected {self.what}'


class Obj(Shape):
    """An object with these keys (others are let be: a newer reconcile may add some)."""

    def __init__(self, fields: dict[str, Shape], *, required: tuple[str, ...] = (), nullable: bool = False):
        self.fields, self.required, self.nullable = fields, required, nullable

    def problem(self, value: object, where: str) -> str | None:
        if value is None and self.nullable:
            return None
        if not isinstance(value, dict):
            return (
                f'"{where}" is {_name(value)}, expected an object'
                if where
                else f"holds {_name(value)}, not an object"
            )
        for key in self.required:
            if key not in value:
                return f'"{_at(where, key)}" is missing'
        for key, shape in self.fields.items():
            if key in value and (found := shape.problem(value[key], _at(where, key))) is not None:
                return found
        return None


class ListOf(Shape):
    def __init__(self, item: Shape, *, nullable: bool = False) -> None:
        self.item, self.nullable = item, nullable

    def problem(self, value: object, where: str) -> str | None:
        if value is None and self.nullable:
            return None
        if not isinstance(value, list):
            return (
                f'"{where}" is {_name(value)}, expected a list'
                if where
                else f"holds {_name(value)}, not a list"
            )
        for n, item in enumerate(value):
            if (found := self.item.problem(item, f"{where}[{n}]")) is not None:
                return found
        return None


class MapOf(Shape):
    """An object whose keys are data (resource names, generation numbers) and values one shape."""

    def __init__(self, value: Shape, *, nullable: bool = False) -> None:
        self.value, self.nullable = value, nullable

    def problem(self, value: object, where: str) -> str | None:
        if value is None and self.nullable:
            return None
        if not isinstance(value, dict):
            return (
                f'"{where}" is {_name(value)}, expected an object'
                if where
                else f"holds {_name(value)}, not an object"
            )
        for key, item in value.items():
            if (found := self.value.problem(item, _at(where, key))) is not None:
                return found
        return None


STR, INT, NUM, BOOL = Scalar("string"), Scalar("integer"), Scalar("number"), Scalar("boolean")
OPT_STR, OPT_INT, OPT_NUM = (
    Scalar("string", nullable=True),
    Scalar("integer", nullable=True),
    Scalar("number", nullable=True),
)
COUNT = Scalar("integer", minimum=0)
# A moment (seconds since the epoch) that time.localtime and strftime can show: 1970 to 9999. Any finite
# number was allowed before, and a 1e300 in pause.json made every run an internal error (OverflowError).
TIME_MAX = 253402300799  # 9999-12-31T23:59:59Z
TIME = Scalar("number", minimum=0, maximum=TIME_MAX)
OPT_TIME = Scalar("number", nullable=True, minimum=0, maximum=TIME_MAX)


def within_last(seconds: float, moment: float, now: float) -> bool:
    """Whether `moment` (a state file's time: a cache entry's mtime, a failed start's `at`) lies within
    the `seconds` before `now`. One dated ahead of now does not: read as a negative age it stayed recent
    until the clock caught up (the clock stepped back since it was written, or a hand set it), a hub
    failure note holding the hub off, failed starts dated a year ahead holding the server down for that
    year (twelfth round)."""
    return 0 <= now - moment < seconds


# A process id os.kill and /proc can take (the kernel's pid_max is at most 2**22). Any pid read from
# text reconcile did not just get from the kernel (a state file, a temp file's name) is held to it: 0 and
# -1 mean a process group or every process to kill(2), and one past 2**31 makes os.kill raise
# OverflowError.
PID_MAX = 1 << 22
PID = Scalar("integer", minimum=1, maximum=PID_MAX)


def is_pid(n: int) -> bool:
    """Whether `n` can be a process's id at all (1 to PID_MAX): the same range as PID."""
    return 1 <= n <= PID_MAX


# A file's size in bytes: what off_t (a signed 64-bit st_size) can hold. A larger "size" names no file
# any filesystem has, and past a float's range it was an OverflowError wherever it was shown or summed
# (the memory rule's table, the free-space check, the download's deadline): a hub listing a 401-digit
# size ended every later plan, offline ones too from the cache, in an internal error (tenth round).
SIZE_MAX = (1 << 63) - 1
SIZE = Scalar("integer", minimum=0, maximum=SIZE_MAX)


def listed_size(value: object) -> int | None:
    """A file's size as a hub's listing gives it (huggingface_hub passes the answer's value through
    unchecked): a count of bytes (an int from 0 to SIZE_MAX; no size at all is 0), else None. A string,
    a float (1e400 is infinity), a list, a negative number or one past SIZE_MAX is the hub's bad answer,
    never int()'s or float division's crash, and never a size the listing's cache reader (SIZE) then
    refuses."""
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= SIZE_MAX:
        return value
    return None


# A commit from outside (a hub's answer, its cache, a lock file, a download record): 40 lowercase hex
# digits, the whole string. One rule for every reader: each once kept its own copy of `^[0-9a-f]{40}$`,
# whose `$` also matches before a final newline, and a fix to one left the others (round 11 fixed apply's
# listing; the plan's listing then took "<40 hex>\n", cached it and ended in an internal error: twelfth).
COMMIT_PATTERN = "[0-9a-f]{40}"
COMMIT = Matching(COMMIT_PATTERN, "a 40-hex commit")


def is_commit(value: object) -> TypeGuard[str]:
    """Whether `value` is a commit: a str of exactly 40 lowercase hex digits (re.fullmatch)."""
    import re

    return type(value) is str and re.fullmatch(COMMIT_PATTERN, value) is not None


# Keys whose value a model's config holds as an open bound: transformers writes Mamba-2's time_step_limit
# as [0.0, Infinity] by default (Mamba2, Bamba, Falcon-H1, Granite-4.0-H, NemotronH), so a real config
# has it. No rule of the preflight reads them, so they are not walked.
OPEN_BOUNDS = frozenset({"time_step_limit", "mamba_dt_limit"})


def outlandish_number(doc: object) -> tuple[str, object] | None:
    """The first number in a JSON document from outside (a model's config.json) that no model has:
    not finite (NaN, Infinity, 1e400) or past SIZE_MAX either way (also written as a string that
    float() reads so: "1e400", "nan"), as (its key path, the value); None
    when every number is within. The preflight's arithmetic takes any number a model has: these ended
    in ValueError or OverflowError (int(inf), a float division past its range) on every plan. Walked
    without recursion (load_json takes nesting as deep as the parser's own limit), and a scalar costs
    no allocation (a path is spelled only for the number found): a 57 MiB list of 30 million numbers
    is walked in 3.7 s, json.loads parses it in 2.5 s (a path per value took 32 s)."""
    import math

    isfinite = math.isfinite
    todo: list[tuple[object, tuple[object, ...] | None]] = [(doc, None)]  # (container, its path: a chain)
    while todo:
        value, at = todo.pop()
        items = (
            value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        )
        for key, item in items:
            kind = type(item)
            if kind is dict or kind is list:
                if key not in OPEN_BOUNDS:
                    todo.append((item, (at, key)))
            elif (
                (kind is float and not (isfinite(item) and -SIZE_MAX <= item <= SIZE_MAX))
                or (kind is int and not -SIZE_MAX <= item <= SIZE_MAX)
                or (kind is str and _outlandish_text(item))
            ):
                return _spelled((at, key)), item
    return None


# The first characters of a string float() may read as a number: its signs, digits, point, the i and n
# of inf and nan, and (tested apart) any Unicode decimal digit or space, which float() takes too.
_NUMERIC_HEAD = frozenset("0123456789+-.iInN")


def _outlandish_text(text: str) -> bool:
    """Whether a string is a number float() reads as one no model has: the preflight's arithmetic calls
    float() on some values (a rope factor, Mamba's expand), so "1e400", "nan" or "-inf" written as a
    string reached int() as infinity or NaN (eleventh round). Only a string that can start a number is
    parsed, so the walk stays as cheap for a config of names."""
    head = text[:1]
    if not head or not (head in _NUMERIC_HEAD or head.isdecimal() or head.isspace()):
        return False
    import math

    try:
        value = float(text)
    except ValueError:
        return False
    return not (math.isfinite(value) and -SIZE_MAX <= value <= SIZE_MAX)


def _spelled(chain: tuple[object, ...] | None) -> str:
    keys: list[object] = []
    while chain is not None:
        keys.append(chain[1])
        chain = chain[0] if isinstance(chain[0], tuple) else None
    out = ""
    for key in reversed(keys):
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else str(key))
    return out
