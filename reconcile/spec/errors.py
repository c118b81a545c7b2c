"""Pydantic validation errors -> one-line "key: what is wrong (what is allowed)" messages; `schema_text`.

Called by `reconcile.spec.loader` (which adds the file and line) and, through it, by `reconcile schema`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from reconcile.spec.lines import Part, dotted
from reconcile.spec.models import Expect, Spec


def unwrap(ann: Any, meta: list[Any]) -> tuple[Any, list[Any]]:
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


def expectation(annotation: Any, metadata: Sequence[Any] = ()) -> Expect:
    """What a value of this type must be, in words (an `Expect` marker in spec.py wins)."""
    ann, meta = unwrap(annotation, list(metadata))
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
        return Expect("a list", f"[...], each {expectation(args[0]).noun}")
    if get_origin(ann) is dict:
        return Expect("a table", f"{{ key = value }}, each value {expectation(args[1]).noun}")
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
        ann, meta = unwrap(ann, meta)
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


def describe(err: Any, doc: dict[str, Any]) -> tuple[list[Part], str]:
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
    expect = expectation(ann, meta)
    if kind == "missing":
        about = (field.description or "").rstrip(".") if field else ""
        about = about[:1].lower() + about[1:]
        if expect.noun.split()[-1] not in about:
            about = f"{about}, {expect.noun}" if about else expect.noun
        return parts, f"missing (required: {about})"
    value: Any = _at_path(doc, parts, err)
    return parts, f"{show(value)} is not {expect.noun} ({expect.allowed})"


def _at_path(doc: Any, parts: list[Part], err: Any) -> Any:
    """The value the error is about: the document's at `parts`, else pydantic's input. A key of a
    table (`[key]`) is the key itself; a value a validator filled in (a deployment's server name) or a
    key that is not there is not in the document (issue 24: a KeyError here was an internal error)."""
    if "[key]" in err.get("loc", ()):
        return err.get("input")
    value = doc
    for p in parts:
        there = isinstance(value, dict) and p in value
        there |= isinstance(value, list) and isinstance(p, int) and -len(value) <= p < len(value)
        if not there:
            return err.get("input")
        value = value[p]
    return value


def show(value: Any) -> str:
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
    elif isinstance(value, dict):
        text = "{ " + ", ".join(f"{dotted([k])} = {show(v)}" for k, v in value.items()) + " }"
        text = text if value else "{}"
    elif isinstance(value, list):
        text = "[" + ", ".join(show(v) for v in value) + "]"
    else:
        text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _model_of(ann: Any) -> type:
    """The model a dict's values are (a [deployments.<name>] table), else `object`."""
    return ann if isinstance(ann, type) and issubclass(ann, BaseModel) else object


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
            ann = unwrap(field.annotation, [])[0]
            many = get_origin(ann) is list
            keyed = get_origin(ann) is dict and issubclass(_model_of(get_args(ann)[1]), BaseModel)
            sub = get_args(ann)[0] if many else _model_of(get_args(ann)[1]) if keyed else ann
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                sections.append((name + (".<name>" if keyed else ""), field, sub, many))
                continue
            default = field.get_default(call_default_factory=True)
            shown = "(required)" if field.is_required() else "(unset)" if default is None else show(default)
            expect = expectation(field.annotation, field.metadata)
            out.append(f"  {prefix}{name} = {shown}")
            out.append(f"      {expect.noun} ({expect.allowed}). {field.description}")
        for name, field, sub, many in sections:  # after the keys, as a TOML file must order them
            head = f"[[{prefix}{name}]]" if many else f"[{prefix}{name}]"
            out.extend(["", f"{head}  {field.description}"])
            model(sub, f"{prefix}{name}{'[]' if many else ''}.")

    model(Spec, "")
    return "\n".join(out)
