"""Spec file -> validated `Spec`: TOML, `extends`, `{section.key}` references, one-line errors.

Called by the CLI commands and the executor (`find_spec`, `load_spec`), and by `reconcile schema`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from typing import Any

from pydantic import BaseModel, ValidationError

from reconcile.errors import SpecError
from reconcile.record import Record
from reconcile.safety.names import control_char
from reconcile.safety.untrusted import JSON_DEPTH_MAX
from reconcile.spec.errors import describe, schema_text, show, unwrap
from reconcile.spec.lines import Part, dotted, syntax_error
from reconcile.spec.lines import Scan as _Scan  # tests reach the scanner here too
from reconcile.spec.loaded import LoadedSpec, find_spec
from reconcile.spec.models import Spec
from reconcile.spec.provenance import OUTSIDE, outside, read_confined, read_trusted

__all__ = [
    "LoadedSpec",
    "dotted",
    "find_spec",
    "load_spec",
    "load_spec_and_texts",
    "schema_text",
    "spec_from_resolved",
]

_PATH = r"[A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*)*"
_REF = re.compile(rf"\{{\{{({_PATH})\}}\}}|\{{({_PATH})\}}")  # {{escaped.path}} | {section.key}
_MISSING = object()
# Free text that only reaches JSON (config.json, the smoke prompt's request) or the plan's header:
# newlines and tabs are allowed there, other control characters (terminal escapes) are not.
_FREE_TEXT = (("machine", "description"), ("health", "smoke_prompt"), ("model", "config"))
CONTROL_ALLOWED = "(text without control characters: no newline, tab or escape code)"


class _File(Record):
    display: str
    abspath: str
    text: str
    doc: dict[str, Any]
    lines: dict[str, int]


def _read(display: str, abspath: str, within: str | None) -> _File:
    """One spec file: its owner and every directory above it checked (reconcile.spec.provenance), or,
    for `validate` (`within` a repository), read as data only inside that repository."""
    raw = read_trusted(abspath, display) if within is None else read_confined(abspath, display, within)
    assert raw is not None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise SpecError(display, line, "", "not UTF-8 text (a TOML file is UTF-8)") from None
    doc = _standard_toml(text)
    if doc is None:
        # tomlkit is pure Python and slow to import (~50 ms, and ~10-20 ms a parse): only a spec that
        # tomllib refuses pays for it (a TOML 1.1 multi-line inline table), and every syntax error
        # is worded from tomlkit's.
        import tomlkit
        from tomlkit.exceptions import TOMLKitError

        try:
            doc = tomlkit.parse(text).unwrap()
        except (TOMLKitError, ValueError) as e:
            raise syntax_error(display, text, e) from None
        except RecursionError:
            raise SpecError(display, None, "", _TOO_DEEP) from None
    lines = _Scan(text).lines
    deep = _nested_past(doc, JSON_DEPTH_MAX)
    if deep is not None:
        at = next((lines[k] for n in range(len(deep), 0, -1) if (k := dotted(deep[:n])) in lines), None)
        raise SpecError(display, at, dotted(deep[:4]), _TOO_DEEP)
    return _File(display, abspath, text, doc, lines)


# The bound untrusted.load_json puts on JSON from outside and on state: the code that walks a spec (its
# references, the preflight memo's key, DeepDiff) recurses a frame or more a level, and a spec nested
# 900 deep ended plan and validate in RecursionError (thirteenth round).
_TOO_DEEP = (
    f"nested deeper than {JSON_DEPTH_MAX} levels (tables, lists, dotted keys): no spec needs that; flatten it"
)


def _nested_past(doc: Any, limit: int) -> list[Part] | None:
    """The path to the first value nested past `limit` levels, found without recursion; None if none."""
    stack: list[tuple[Any, list[Part]]] = [(doc, [])]
    while stack:
        node, parts = stack.pop()
        if len(parts) > limit:
            return parts
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        stack += [(v, [*parts, k]) for k, v in items]
    return None


def _standard_toml(text: str) -> dict[str, Any] | None:
    """The document by the standard library's TOML 1.0 parser (3.11+), or None: ask tomlkit. What
    tomllib accepts, tomlkit reads the same (tests/test_loading_toml.py)."""
    if sys.version_info >= (3, 11):  # 3.10 has no tomllib
        import tomllib

        try:
            doc: dict[str, Any] = tomllib.loads(text)
            return doc
        except Exception:  # refused, or deeper than it recurses: tomlkit decides and words the error
            return None
    return None


def _read_chain(path: str, within: str | None) -> list[_File]:
    chain = [_read(path, os.path.abspath(path), within)]
    while (target := chain[-1].doc.pop("extends", None)) is not None:
        here = chain[-1]
        where = (here.display, here.lines.get("extends"), "extends")
        if not isinstance(target, str) or not target.strip():
            raise SpecError(*where, f"{show(target)} is not a file name (a base spec, relative to here)")
        nxt = os.path.normpath(os.path.join(os.path.dirname(here.abspath), target))
        display = os.path.normpath(os.path.join(os.path.dirname(here.display), target))
        real = [os.path.realpath(f.abspath) for f in chain]
        if os.path.realpath(nxt) in real:
            if real[-1] == os.path.realpath(nxt):
                raise SpecError(*where, f"{show(target)} is this file itself (a spec cannot extend itself)")
            loop = " -> ".join([f.display for f in chain[real.index(os.path.realpath(nxt)) :]] + [display])
            raise SpecError(*where, f"{show(target)} makes a cycle: {loop} (bases cannot extend back)")
        if within is not None and outside(nxt, within):  # before a look at it: nothing of it is shown
            raise SpecError(*where, f"{show(target)} is " + OUTSIDE.format(root=within))
        if not os.path.exists(nxt):
            raise SpecError(*where, f"{show(target)} not found (looked at {nxt}; relative to this file)")
        chain.append(_read(display, nxt, within))
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


def _control_characters(node: Any, parts: list[Part]) -> list[tuple[list[Part], str]]:
    """Every string (key or value) holding a control character, as (where, message)."""
    found: list[tuple[list[Part], str]] = []
    free = any(tuple(parts[: len(f)]) == f for f in _FREE_TEXT)

    def what(text: str) -> str | None:
        return control_char(text.replace("\n", "").replace("\t", "") if free else text)

    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(key, str) and (bad := what(key)):
                found.append(([*parts, key], f"the key holds a control character ({bad}) {CONTROL_ALLOWED}"))
            found += _control_characters(value, [*parts, key])
    elif isinstance(node, list):
        for n, value in enumerate(node):
            found += _control_characters(value, [*parts, n])
    elif isinstance(node, str) and (bad := what(node)):
        found.append((parts, f"{show(node)} holds a control character ({bad}) {CONTROL_ALLOWED}"))
    return found


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
        model = unwrap(field.annotation, [])[0]
    return _MISSING


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
    found = [(e.parts, e.message) for e in refs.errors] + _control_characters(resolved, [])
    try:
        spec = Spec.model_validate(resolved)
    except ValidationError as e:
        described = (describe(err, resolved) for err in e.errors())
        found += [(parts, msg) for parts, msg in described if dotted(parts) not in refs.failed]
    if found:
        raise _first(chain, origin, found)
    canonical = json.dumps(resolved, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    return LoadedSpec(spec, path, chain[0].text, digest, tuple(f.abspath for f in chain), resolved)


def load_spec(path: str, within: str | None = None) -> LoadedSpec:
    """Read, merge bases, resolve references, validate. Raises one `SpecError` (FILE:LINE: key: ...).
    `within`: a repository `validate` checks; its files are data, and nothing outside it is read."""
    return load_spec_and_texts(path, within)[0]


def load_spec_and_texts(path: str, within: str | None = None) -> tuple[LoadedSpec, tuple[str, ...]]:
    """`load_spec`, and the text of each file it read (the spec's, then its bases'): the spec cache
    keys on exactly what was validated, never on a later read that a concurrent edit could change."""
    chain = _read_chain(path, within)
    merged: dict[str, Any] = {}
    origin: dict[str, int] = {}
    for rank in reversed(range(len(chain))):
        _merge(merged, chain[rank].doc, rank, origin, [])
    return _finish(chain, merged, origin, path), tuple(f.text for f in chain)


def spec_from_resolved(resolved: dict[str, Any], text: str, path: str) -> LoadedSpec:
    """A recorded generation's document back into a LoadedSpec (rollback); errors carry no line."""
    doc = json.loads(json.dumps(resolved))
    chain = [_File(path, os.path.abspath(path), text, doc, {})]
    return _finish(chain, doc, {}, path, resolve=False)
