"""Spec file -> validated `Spec`: TOML, `extends`, `{section.key}` references, one-line errors.

Called by the CLI commands and the executor (`find_spec`, `load_spec`), and by `reconcile schema`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import tomlkit
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from tomlkit.exceptions import TOMLKitError

from reconcile.errors import ReconcileError, SpecError
from reconcile.spec import Expect, Spec

Part = str | int
_BARE = re.compile(r"[A-Za-z0-9_-]+")
_SCALAR = re.compile(r"\d{4}-\d\d-\d\d[Tt ]\d\d:[\d:.]+(?:[Zz]|[+-]\d\d:\d\d)?|[^\s,\]}#]+")
_PATH = r"[A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*)*"
_REF = re.compile(rf"\{{\{{({_PATH})\}}\}}|\{{({_PATH})\}}")  # {{escaped.path}} | {section.key}
_MISSING = object()


@dataclass(frozen=True)
class LoadedSpec:
    spec: Spec
    path: str  # as the user gave it
    text: str  # the main file's own text
    sha256: str  # of `resolved` as canonical JSON: a change in a base file changes it
    files: tuple[str, ...]  # the spec, then every base it extends, absolute
    resolved: dict[str, Any]  # the merged, reference-resolved document that `spec` validates


@dataclass(frozen=True)
class _File:
    display: str
    abspath: str
    text: str
    doc: dict[str, Any]
    lines: dict[str, int]


def dotted(parts: Sequence[Part]) -> str:
    """("server", "args", "max-model-len") -> server.args.max-model-len; ints index: a.b[0].c."""
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += ("." if out else "") + (p if _BARE.fullmatch(p) else json.dumps(p, ensure_ascii=False))
    return out


class _Scan:
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


def _syntax_error(f_display: str, text: str, e: Exception) -> SpecError:
    line: int | None = getattr(e, "line", None)
    msg, key = re.sub(r" at line \d+ col \d+$", "", str(e)), ""
    col = getattr(e, "col", 0)
    if "already exists" in msg or "Redefinition" in msg:
        twice = _Scan(text).twice  # its line is the second definition's own; tomlkit's may be the next
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


def _read(display: str, abspath: str) -> _File:
    try:
        with open(abspath, "rb") as fh:
            raw = fh.read()
    except OSError as e:
        raise SpecError(display, None, "", f"cannot read ({e.strerror})") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise SpecError(display, line, "", "not UTF-8 text (a TOML file is UTF-8)") from None
    try:
        doc = tomlkit.parse(text).unwrap()
    except (TOMLKitError, ValueError) as e:
        raise _syntax_error(display, text, e) from None
    return _File(display, abspath, text, doc, _Scan(text).lines)


def _read_chain(path: str) -> list[_File]:
    chain = [_read(path, os.path.abspath(path))]
    while (target := chain[-1].doc.pop("extends", None)) is not None:
        here = chain[-1]
        where = (here.display, here.lines.get("extends"), "extends")
        if not isinstance(target, str) or not target.strip():
            raise SpecError(*where, f"{_show(target)} is not a file name (a base spec, relative to here)")
        nxt = os.path.normpath(os.path.join(os.path.dirname(here.abspath), target))
        display = os.path.normpath(os.path.join(os.path.dirname(here.display), target))
        real = [os.path.realpath(f.abspath) for f in chain]
        if os.path.realpath(nxt) in real:
            if real[-1] == os.path.realpath(nxt):
                raise SpecError(*where, f"{_show(target)} is this file itself (a spec cannot extend itself)")
            loop = " -> ".join([f.display for f in chain[real.index(os.path.realpath(nxt)) :]] + [display])
            raise SpecError(*where, f"{_show(target)} makes a cycle: {loop} (bases cannot extend back)")
        if not os.path.isfile(nxt):
            raise SpecError(*where, f"{_show(target)} not found (looked at {nxt}; relative to this file)")
        chain.append(_read(display, nxt))
    return chain


def _merge(
    into: dict[str, Any], over: dict[str, Any], rank: int, origin: dict[str, int], at: list[Part]
) -> None:
    """Tables merge key by key; arrays and scalars of `over` replace. `origin`: dotted key -> file rank."""
    for key, value in over.items():
        parts = [*at, key]
        name = dotted(parts)
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            origin[name] = rank
            _merge(into[key], value, rank, origin, parts)
            continue
        for old in [k for k in origin if k == name or k.startswith((name + ".", name + "["))]:
            del origin[old]
        into[key] = value
        _note_origin(value, rank, origin, parts)


def _note_origin(value: Any, rank: int, origin: dict[str, int], parts: list[Part]) -> None:
    origin[dotted(parts)] = rank
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        _note_origin(item, rank, origin, [*parts, key])


class _Located(Exception):
    def __init__(self, parts: list[Part], message: str) -> None:
        super().__init__(message)
        self.parts, self.message = parts, message


class _Refs:
    """Resolves `{section.key}` in every string of the merged document (escape: `{{section.key}}`)."""

    def __init__(self, doc: dict[str, Any], spec_dir: str) -> None:
        self.doc, self.spec_dir, self.done = doc, spec_dir, dict[str, str]()
        self.errors: list[_Located] = []
        self.failed: set[str] = set()  # values left unresolved: their validation errors would mislead

    def walk(self, node: Any, parts: list[Part]) -> Any:
        if isinstance(node, dict):
            return {k: self.walk(v, [*parts, k]) for k, v in node.items()}
        if isinstance(node, list):
            return [self.walk(v, [*parts, n]) for n, v in enumerate(node)]
        if isinstance(node, str) and "{" in node:
            try:
                return self.expand(node, parts, (dotted(parts),))
            except _Located as e:
                self.errors.append(e)
                self.failed.add(dotted(parts))
        return node

    def expand(self, text: str, parts: list[Part], stack: tuple[str, ...]) -> str:
        used_dir = False

        def one(m: re.Match[str]) -> str:
            nonlocal used_dir
            if m.group(1):
                return "{" + m.group(1) + "}"
            used_dir = used_dir or m.group(2) == "spec_dir"
            return self.value(m.group(2), parts, stack)

        out = _REF.sub(one, text)
        return os.path.normpath(out) if used_dir else out

    def value(self, path: str, parts: list[Part], stack: tuple[str, ...]) -> str:
        if path == "spec_dir":
            return self.spec_dir
        node: Any = self.doc
        for key in path.split("."):
            node = node.get(key, _MISSING) if isinstance(node, dict) else _MISSING
        node = _default_of(path.split(".")) if node is _MISSING else node
        if node is _MISSING:
            raise _Located(parts, f"{{{path}}} refers to nothing (a key of this spec, e.g. {{model.dir}})")
        if isinstance(node, (dict, list)):
            kind = "a table" if isinstance(node, dict) else "an array"
            raise _Located(parts, f"{{{path}}} is {kind} (a reference names one string, number or boolean)")
        if isinstance(node, bool):
            return "true" if node else "false"
        if not isinstance(node, str):
            return str(node)
        if path in stack:
            loop = " -> ".join([stack[-1], *stack[stack.index(path) :]])  # from the value that holds it
            raise _Located(parts, f"{{{path}}} makes a cycle: {loop} (no value may refer back to itself)")
        if path not in self.done:
            self.done[path] = self.expand(node, [*path.split(".")], (*stack, path))
        return self.done[path]


def _default_of(keys: list[str]) -> Any:
    """`{machine.state_dir}` works when the spec leaves it at its default."""
    model: Any = Spec
    for n, key in enumerate(keys):
        is_model = isinstance(model, type) and issubclass(model, BaseModel)
        field = model.model_fields.get(key) if is_model else None
        if field is None:
            return _MISSING
        if n == len(keys) - 1:
            value = field.get_default(call_default_factory=True)
            return value if isinstance(value, (str, int, float)) else _MISSING
        model = _unwrap(field.annotation, [])[0]
    return _MISSING


def _unwrap(ann: Any, meta: list[Any]) -> tuple[Any, list[Any]]:
    """Strip Annotated (keeping its metadata) and Optional."""
    while True:
        if get_origin(ann) is Annotated:
            ann, *extra = get_args(ann)
            meta = [*extra, *meta]
        elif get_origin(ann) in (Union, type(int | str)) and type(None) in get_args(ann):
            rest = [a for a in get_args(ann) if a is not type(None)]
            if len(rest) != 1:
                return ann, meta
            ann = rest[0]
        else:
            return ann, meta


def _expectation(annotation: Any, metadata: Sequence[Any] = ()) -> Expect:
    """What a value of this type must be, in words (an `Expect` marker in spec.py wins)."""
    ann, meta = _unwrap(annotation, list(metadata))
    if marker := next((m for m in meta if isinstance(m, Expect)), None):
        return marker
    found = {k: getattr(m, k) for m in meta for k in ("ge", "gt", "le") if getattr(m, k, None) is not None}
    bounds = "".join(f" {op} {found[k]}" for k, op in (("ge", ">="), ("gt", ">"), ("le", "<=")) if k in found)
    if {"ge", "le"} <= set(found):
        bounds = f" {found['ge']}-{found['le']}"
    args = get_args(ann)
    if get_origin(ann) is Literal:
        return Expect("one of the choices", " or ".join(json.dumps(a) for a in args))
    if get_origin(ann) is list:
        return Expect("a list", f"[...], each {_expectation(args[0]).noun}")
    if get_origin(ann) is dict:
        return Expect("a table", f"{{ key = value }}, each value {_expectation(args[1]).noun}")
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return Expect("a table", "keys " + ", ".join(ann.model_fields))
    simple = {
        bool: ("a boolean", "true or false, without quotes"),
        int: ("an integer", f"a whole number{bounds}"),
        float: ("a number", f"a number{bounds}"),
        str: ("a string", "text in quotes"),
    }
    return Expect(*simple.get(ann, ("a value", "a TOML value")))


def _follow(loc: tuple[Part, ...]) -> tuple[list[Part], Any, list[Any], Any, FieldInfo | None]:
    """A pydantic loc -> (dotted parts, annotation there, its metadata, enclosing model, field)."""
    parts: list[Part] = []
    ann: Any = Spec
    meta: list[Any] = []
    model: Any = Spec
    field: FieldInfo | None = None
    for n, item in enumerate(loc):
        ann, meta = _unwrap(ann, meta)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model, field = ann, ann.model_fields.get(str(item))
            parts.append(item)
            if field is None:
                return parts, None, [], model, None
            ann, meta = field.annotation, list(field.metadata)
        elif get_origin(ann) is list and isinstance(item, int):
            parts.append(item)
            ann, meta, field = get_args(ann)[0], [], None
        elif get_origin(ann) is dict and item != "[key]":
            parts.append(item)
            ann, meta, field = get_args(ann)[0 if loc[n + 1 : n + 2] == ("[key]",) else 1], [], None
        elif item != "[key]":
            break  # a union of several types: the rest of loc names its members
    return parts, ann, meta, model, field


def _describe(err: Any, doc: dict[str, Any]) -> tuple[list[Part], str]:
    parts, ann, meta, model, field = _follow(tuple(err["loc"]))
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind == "extra_forbidden":
        import difflib

        allowed = [*model.model_fields, *(["extends"] if model is Spec else [])]
        close = difflib.get_close_matches(str(parts[-1]), allowed, n=1)
        hint = f", did you mean {close[0]}?" if close else ""
        if parts[-1] == "extends":
            hint = ": extends goes at the top of the file, before any [table]"
        return parts, f"unknown key{hint} (allowed: {', '.join(allowed)})"
    if kind == "spec":
        return [*parts, *ctx.get("at", ())], str(err["msg"])
    if kind in ("value_error", "assertion_error"):
        return parts, str(ctx.get("error", err["msg"]))
    expect = _expectation(ann, meta)
    if kind == "missing":
        about = (field.description or "").rstrip(".") if field else ""
        about = about[:1].lower() + about[1:]
        if expect.noun.split()[-1] not in about:
            about = f"{about}, {expect.noun}" if about else expect.noun
        return parts, f"missing (required: {about})"
    value: Any = doc
    for p in parts:
        value = value[p] if isinstance(value, dict) or isinstance(p, int) else err.get("input")
    return parts, f"{_show(value)} is not {expect.noun} ({expect.allowed})"


def _locate(chain: list[_File], origin: dict[str, int], parts: list[Part]) -> tuple[int, str, int | None]:
    """The file and line that hold a key; a missing key is reported at its section's header."""
    for n in range(len(parts), 0, -1):
        rank = origin.get(dotted(parts[:n]))
        if rank is not None and dotted(parts[:n]) in chain[rank].lines:
            return rank, chain[rank].display, chain[rank].lines[dotted(parts[:n])]
    return 0, chain[0].display, None


def _first(chain: list[_File], origin: dict[str, int], found: list[tuple[list[Part], str]]) -> SpecError:
    """Several problems: the first in file order (the main file, then its bases)."""
    where = [(*_locate(chain, origin, parts), dotted(parts), msg) for parts, msg in found]
    _, file, line, key, msg = min(where, key=lambda w: (w[0], 10**9 if w[2] is None else w[2]))
    return SpecError(file, line, key, msg)


def _finish(
    chain: list[_File], merged: dict[str, Any], origin: dict[str, int], path: str, resolve: bool = True
) -> LoadedSpec:
    refs = _Refs(merged, os.path.dirname(chain[0].abspath))
    resolved = refs.walk(merged, []) if resolve else merged
    found = [(e.parts, e.message) for e in refs.errors]
    try:
        spec = Spec.model_validate(resolved)
    except ValidationError as e:
        described = (_describe(err, resolved) for err in e.errors())
        found += [(parts, msg) for parts, msg in described if dotted(parts) not in refs.failed]
    if found:
        raise _first(chain, origin, found)
    canonical = json.dumps(resolved, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    return LoadedSpec(spec, path, chain[0].text, digest, tuple(f.abspath for f in chain), resolved)


def load_spec(path: str) -> LoadedSpec:
    """Read, merge bases, resolve references, validate. Raises one `SpecError` (FILE:LINE: key: ...)."""
    chain = _read_chain(path)
    merged: dict[str, Any] = {}
    origin: dict[str, int] = {}
    for rank in reversed(range(len(chain))):
        _merge(merged, chain[rank].doc, rank, origin, [])
    return _finish(chain, merged, origin, path)


def spec_from_resolved(resolved: dict[str, Any], text: str, path: str) -> LoadedSpec:
    """A recorded generation's document back into a LoadedSpec (rollback); errors carry no line."""
    doc = json.loads(json.dumps(resolved))
    chain = [_File(path, os.path.abspath(path), text, doc, {})]
    return _finish(chain, doc, {}, path, resolve=False)


def find_spec(explicit: str | None, specs_dir: str = "specs", hostname: str | None = None) -> str:
    """`--spec PATH` if given, else specs/<hostname>.toml."""
    if explicit is not None:
        if not os.path.isfile(explicit):
            raise ReconcileError(f"--spec {explicit}: no such file (give the path of a spec file)")
        return explicit
    if hostname is None:
        import socket

        hostname = socket.gethostname()
    candidate = os.path.join(specs_dir, f"{hostname}.toml")
    if os.path.isfile(candidate):
        return candidate
    raise ReconcileError(
        f"no spec: --spec not given and {candidate} does not exist "
        f"(pass --spec PATH, or run `reconcile init` to write {candidate})"
    )


def _show(value: Any) -> str:
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
    elif isinstance(value, dict):
        text = "{ " + ", ".join(f"{dotted([k])} = {_show(v)}" for k, v in value.items()) + " }"
        text = text if value else "{}"
    elif isinstance(value, list):
        text = "[" + ", ".join(_show(v) for v in value) + "]"
    else:
        text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def schema_text() -> str:
    """Every section.key with its type, default and meaning (`reconcile schema`)."""
    out = [
        "Every key of a reconcile spec: `section.key = default`, then what it must be and what it means.",
        'A spec may start with `extends = "base.toml"` (relative to the file; tables merge, arrays and',
        "values replace). Strings may hold {section.key} references to other values, resolved after the",
        "merge; {spec_dir} is the spec file's directory (paths built from it are normalised);",
        "{{section.key}} is the literal text {section.key}.",
    ]

    def model(cls: type[BaseModel], prefix: str) -> None:
        sections = []
        for name, field in cls.model_fields.items():
            ann = _unwrap(field.annotation, [])[0]
            many = get_origin(ann) is list
            sub = get_args(ann)[0] if many else ann
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                sections.append((name, field, sub, many))
                continue
            default = field.get_default(call_default_factory=True)
            shown = "(required)" if field.is_required() else "(unset)" if default is None else _show(default)
            expect = _expectation(field.annotation, field.metadata)
            out.append(f"  {prefix}{name} = {shown}")
            out.append(f"      {expect.noun} ({expect.allowed}). {field.description}")
        for name, field, sub, many in sections:  # after the keys, as a TOML file must order them
            head = f"[[{prefix}{name}]]" if many else f"[{prefix}{name}]"
            out.extend(["", f"{head}  {field.description}"])
            model(sub, f"{prefix}{name}{'[]' if many else ''}.")

    model(Spec, "")
    return "\n".join(out)
