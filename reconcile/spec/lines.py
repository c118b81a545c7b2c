"""TOML text -> where each dotted key is defined, and tomlkit's syntax errors as one-line messages.

Called by `reconcile.spec.loader`: tomlkit keeps no line numbers, and a spec error names FILE:LINE.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from collections.abc import Sequence

from reconcile.errors import SpecError

Part = str | int
_BARE = re.compile(r"[A-Za-z0-9_-]+")
_SCALAR = re.compile(r"\d{4}-\d\d-\d\d[Tt ]\d\d:[\d:.]+(?:[Zz]|[+-]\d\d:\d\d)?|[^\s,\]}#]+")


def dotted(parts: Sequence[Part]) -> str:
    """("server", "args", "max-model-len") -> server.args.max-model-len; ints index: a.b[0].c."""
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += ("." if out else "") + (p if _BARE.fullmatch(p) else json.dumps(p, ensure_ascii=False))
    return out


class Scan:
    """dotted key -> line, from TOML text tomlkit accepted (tomlkit keeps no positions)."""

    def __init__(self, text: str) -> None:
        self.s, self.i = text, 0
        self.starts = [0, *(m.end() for m in re.finditer("\n", text))]
        self.lines: dict[str, int] = {}
        self.kinds: dict[str, str] = {}
        self.twice: list[tuple[str, int]] = []  # keys defined again: tomlkit names some without a line
        self.aot: dict[str, int] = {}
        prefix: list[Part] = []
        try:
            while self._skip() < len(self.s):
                if self.s.startswith("[[", self.i):
                    prefix = self._header(2)
                elif self.s[self.i] == "[":
                    prefix = self._header(1)
                else:
                    self._keyval(prefix)
        except (IndexError, AttributeError):  # text tomlkit refused: keep what was indexed
            pass

    def _skip(self, newlines: bool = True) -> int:
        while self.i < len(self.s):
            c = self.s[self.i]
            if c in " \t" or (newlines and c in "\r\n"):
                self.i += 1
            elif c == "#" and newlines:
                end = self.s.find("\n", self.i)
                self.i = len(self.s) if end < 0 else end
            else:
                break
        return self.i

    def _mark(self, parts: list[Part], kind: str) -> None:
        name, old = dotted(parts), self.kinds.get(dotted(parts))
        line = bisect_right(self.starts, self.i)
        if old is None or kind == "element" or (kind == "header" and old == "implicit"):
            self.lines[name], self.kinds[name] = line, kind
        elif kind in ("leaf", "header") or (old in ("leaf", "header") and kind == "dotted"):
            self.twice.append((name, line))

    def _header(self, brackets: int) -> list[Part]:
        self.i += brackets
        keys, parts = self._key(), list[Part]()
        self.i += brackets
        for n, key in enumerate(keys):
            parts.append(key)
            name, last = dotted(parts), n == len(keys) - 1
            if last and brackets == 2:
                self.aot[name] = self.aot.get(name, -1) + 1
                self._mark(parts, "implicit")
                parts.append(self.aot[name])
                self._mark(parts, "element")
            elif name in self.aot:  # [a.b] below [[a]] belongs to a's last entry
                parts.append(self.aot[name])
            else:
                self._mark(parts, "header" if last else "implicit")
        return parts

    def _key(self) -> list[str]:
        parts = []
        while True:
            self._skip(newlines=False)
            if self.s[self.i] in "\"'":
                parts.append(self._string())
            else:
                m = _BARE.match(self.s, self.i)
                if m is None:
                    raise IndexError(self.i)
                parts.append(m.group())
                self.i = m.end()
            if self.s[self._skip(newlines=False)] != ".":
                return parts
            self.i += 1

    def _string(self) -> str:
        q = self.s[self.i]
        n = 3 if self.s.startswith(q * 3, self.i) else 1
        self.i += n
        start = self.i
        while not self.s.startswith(q * n, self.i):
            self.i += 2 if q == '"' and self.s[self.i] == "\\" else 1
        raw = self.s[start : self.i]
        self.i += n
        while n == 3 and self.s.startswith(q, self.i):  # """a"""" ends with a quote
            self.i += 1
        try:
            return str(json.loads(f'"{raw}"')) if q == '"' else raw
        except ValueError:
            return raw

    def _keyval(self, prefix: list[Part]) -> None:
        keys = self._key()
        for n in range(1, len(keys)):
            self._mark([*prefix, *keys[:n]], "dotted")
        self._mark([*prefix, *keys], "leaf")
        self._skip(newlines=False)
        self.i += 1  # =
        self._skip(newlines=False)
        self._value([*prefix, *keys])

    def _value(self, parts: list[Part]) -> None:
        c = self.s[self.i]
        if c in "{[":
            self.i += 1
            n = 0
            while self._skip() < len(self.s) and self.s[self.i] not in "}]":
                if self.s[self.i] == ",":
                    self.i += 1
                elif c == "{":
                    self._keyval(parts)
                else:
                    self._mark([*parts, n], "element")
                    self._value([*parts, n])
                    n += 1
            self.i += 1
        elif c in "\"'":
            self._string()
        else:
            m = _SCALAR.match(self.s, self.i)
            self.i = m.end() if m else self.i + 1


def syntax_error(f_display: str, text: str, e: Exception) -> SpecError:
    line: int | None = getattr(e, "line", None)
    msg, key = re.sub(r" at line \d+ col \d+\Z", "", str(e)), ""
    col = getattr(e, "col", 0)
    if "already exists" in msg or "Redefinition" in msg:
        twice = Scan(text).twice  # its line is the second definition's own; tomlkit's may be the next
        if twice:
            key, line = twice[0]
        return SpecError(f_display, line, key, "defined twice (a key or [table] appears once; merge them)")
    elif msg.startswith("Control characters"):
        msg = "unterminated string, or a control character in one (close the quote; write \\n for a newline)"
    elif msg.startswith("Invalid character") and "in string" in msg:
        msg = "bad escape in a string (\\n \\t \\\" \\\\ \\uXXXX; or a 'literal string' without escapes)"
    elif msg.startswith("Invalid key"):
        msg = msg.replace("Invalid key", "bad key") + ' (letters, digits, _ and -, or "quoted", then = value)'
    elif m := re.match(r"Unexpected character: (.*)", msg):
        before = text.splitlines()[line - 1][:col] if line and line <= len(text.splitlines()) else ""
        msg = {"'\\n'": "unexpected end of line", "'\\x00'": "unexpected end of file"}.get(
            m.group(1), f"unexpected character {m.group(1)}"
        )
        if re.fullmatch(r"\s*[^=\[#]+=\s*", before):
            msg += ' (a value: "string", number, true/false, [array] or { table })'
        elif before.lstrip().startswith("["):
            msg += " (a [table] header ends with ])"
        elif m.group(1) in ("'\\x00'", "'['"):
            msg += " (an [array] or { table } left open above?)"
    else:
        msg = msg[:1].lower() + msg[1:]
    return SpecError(f_display, line, key, f"invalid TOML: {msg}")
