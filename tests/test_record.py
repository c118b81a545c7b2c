"""reconcile.record.Record behaves as typing.NamedTuple, for every record class of the code.

Each record class is compared with the typing.NamedTuple made from the same fields and defaults: the
class attributes, construction (positional, keyword, defaults), repr, equality, hashing, `_make`,
`_replace`, `_asdict`, pickling and copying, pattern matching, and the kind of error for a bad call.
The class rules (underscore names, field order, reserved names) are held against typing's too.
"""

import copy
import importlib
import pickle
import pkgutil
import re
import typing
from pathlib import Path

import pytest

import actions
import probes
import reconcile
from reconcile.record import Record

ROOT = Path(__file__).resolve().parent.parent


def _all_record_classes() -> list[type]:
    for package in (reconcile, probes, actions):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if not info.name.endswith(".__main__"):
                importlib.import_module(info.name)
    found: list[type] = []
    todo = list(Record.__subclasses__())
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return sorted(found, key=lambda c: (c.__module__, c.__qualname__))


RECORDS = [cls for cls in _all_record_classes() if cls.__bases__ == (Record,)]


def _twin(cls: type) -> type:
    """The typing.NamedTuple of the same name, fields and defaults."""
    fields = [(name, object) for name in cls._fields]  # type: ignore[attr-defined]
    twin = typing.NamedTuple(cls.__name__, fields)  # type: ignore[misc]
    twin.__new__.__defaults__ = tuple(cls._field_defaults.values()) or None  # type: ignore[attr-defined]
    twin._field_defaults = dict(cls._field_defaults)  # type: ignore[attr-defined]
    return twin


def _sample(cls: type) -> tuple[object, ...]:
    return tuple(f"v{i}" for i in range(len(cls._fields)))  # type: ignore[attr-defined]


def test_the_code_has_records_and_none_made_by_typing() -> None:
    assert len(RECORDS) >= 60, [c.__qualname__ for c in RECORDS]
    offenders = []
    for folder in ("reconcile", "probes", "actions"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            if "(NamedTuple)" in text or "typing.NamedTuple(" in text:
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == ["reconcile/record.py"] or offenders == [], offenders


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_record_matches_typing_namedtuple(cls: type) -> None:
    twin = _twin(cls)
    fields = cls._fields  # type: ignore[attr-defined]
    assert fields == twin._fields  # type: ignore[attr-defined]
    assert cls.__match_args__ == twin.__match_args__  # type: ignore[attr-defined]
    assert cls._field_defaults == twin._field_defaults  # type: ignore[attr-defined]
    assert not hasattr(cls(*_sample(cls)), "__dict__")

    values = _sample(cls)
    mine, theirs = cls(*values), twin(*values)
    assert tuple(mine) == tuple(theirs) == values
    if "__eq__" not in vars(cls) and "__hash__" not in vars(cls):
        assert mine == theirs and hash(mine) == hash(theirs)
    if "__repr__" not in vars(cls):  # a record holding a secret has its own repr
        assert repr(mine) == repr(theirs)
    assert mine._asdict() == theirs._asdict()  # type: ignore[attr-defined]
    assert cls._make(values) == mine  # type: ignore[attr-defined]
    for name, value in zip(fields, values, strict=True):
        assert getattr(mine, name) == value
    if fields:
        first = fields[0]
        changed = mine._replace(**{first: "new"})  # type: ignore[attr-defined]
        assert type(changed) is cls and changed == theirs._replace(**{first: "new"})  # type: ignore[attr-defined]
        by_keyword = cls(**dict(zip(fields, values, strict=True)))
        assert by_keyword == mine

    required = [f for f in fields if f not in cls._field_defaults]  # type: ignore[attr-defined]
    with_defaults = cls(*values[: len(required)])
    assert with_defaults == twin(*values[: len(required)])

    if cls.__module__ != "__main__" and "<locals>" not in cls.__qualname__:
        assert pickle.loads(pickle.dumps(mine)) == mine
        assert type(pickle.loads(pickle.dumps(mine))) is cls
    assert copy.deepcopy(mine) == mine and type(copy.copy(mine)) is cls

    bad_calls: list[tuple[tuple[object, ...], dict[str, object]]] = [
        ((*values, "one too many"), {}),
        ((), {"no_such_field": 1}),
    ]
    if required:
        bad_calls.append(((), {}))
        bad_calls.append((values[:1], {required[0]: "twice"}))
    for args, kwargs in bad_calls:
        with pytest.raises(TypeError) as expected:
            twin(*args, **kwargs)
        with pytest.raises(TypeError, match=re.escape(str(expected.value))):  # the same words
            cls(*args, **kwargs)
    with pytest.raises(ValueError, match="unexpected field names"):
        mine._replace(no_such_field=1)  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="Expected"):
        cls._make((*values, "extra"))  # type: ignore[attr-defined]


def test_match_and_subclass() -> None:
    class Point(Record):
        x: int
        y: "int" = 0  # a string annotation is never evaluated

        def norm(self) -> int:
            return abs(self.x) + abs(self.y)

    class Named(Point):
        def label(self) -> str:
            return f"{self.x},{self.y}"

    match Point(3, -4):
        case Point(x, y):
            assert (x, y) == (3, -4)
    assert Point(3, -4).norm() == 7
    assert Named(1, 2).label() == "1,2" and Named._fields == ("x", "y")
    assert Point.__doc__ == "Point(x, y)"


@pytest.mark.parametrize(
    "body, error",
    [
        ("_hidden: int", ValueError),
        ("a: int = 1\n    b: int", TypeError),
        ("a: int\n    def _replace(self): pass", AttributeError),
        ("a: int\n    _fields = ('b',)", AttributeError),
    ],
)
def test_class_rules_match_typing(body: str, error: type[Exception]) -> None:
    for base, where in ((Record, "Record"), (typing.NamedTuple, "NamedTuple")):
        source = f"class Bad({where}):\n    {body}\n"
        with pytest.raises(error):
            exec(source, {where: base})


def test_a_record_inherits_from_record_alone() -> None:
    class Mixin:
        pass

    with pytest.raises(TypeError, match="Record alone"):

        class Bad(Record, Mixin):  # type: ignore[misc]
            a: int


def test_fields_from_a_class_body_without_postponed_annotations() -> None:
    """Python 3.14 (PEP 649) leaves no `__annotations__` in such a class body: the compiler stores an
    annotate function under `__annotate_func__` (annotationlib.get_annotate_from_class_namespace
    reads that key). This is that namespace, made by hand, so the test runs on any version."""

    def annotate(format: int) -> dict[str, object]:
        if format != 1:  # annotationlib.Format.VALUE; the other formats are optional for an annotate function
            raise NotImplementedError
        return {"pid": int, "name": str}

    made = type(Record)(
        "Made", (Record,), {"__module__": __name__, "__annotate_func__": annotate, "name": ""}
    )
    assert made._fields == ("pid", "name") and made._field_defaults == {"name": ""}
    assert made(7) == (7, "") and repr(made(7, "x")) == "Made(pid=7, name='x')"
    # and the class statement itself, whichever way this Python keeps a class body's annotations
    scope: dict[str, object] = {"Record": Record, "__name__": __name__}
    exec("class Real(Record):\n    pid: int\n    name: str = ''\n", scope)
    assert scope["Real"]._fields == ("pid", "name")  # type: ignore[attr-defined]


def test_the_probes_and_resource_rows_of_a_plan_import_no_typing() -> None:
    """A warm plan of a GPU machine's spec imports its gpu and cuda probes and the resources' facts:
    none of them may bring typing back (the CPU demo that benchmarks/import_time.py checks has none)."""
    import subprocess
    import sys

    from reconcile.plan.prober import PROBES

    modules = sorted(
        {p.module for p in PROBES} | {f"reconcile.resources.{m.name}" for m in _resource_modules()}
    )
    for module in modules:
        code = f"import sys, {module}; print('typing' in sys.modules)"
        found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
        assert found.stdout.strip() == "False", (module, found.stderr[-300:])


def _resource_modules() -> list[pkgutil.ModuleInfo]:
    import reconcile.resources

    return list(pkgutil.iter_modules(reconcile.resources.__path__))


def test_every_module_with_records_postpones_its_annotations() -> None:
    """A record's fields are read from the class body's `__annotations__` dict. Without postponed
    annotations Python 3.14 keeps an annotate function instead, which only annotationlib (with ast
    and enum: milliseconds of a warm plan) can call."""
    missing = []
    for folder in ("reconcile", "probes", "actions"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            if "(Record):" in text and "from __future__ import annotations" not in text:
                missing.append(str(path.relative_to(ROOT)))
    assert missing == ["reconcile/record.py"], missing
