"""`Record`: the records of typing.NamedTuple, made for a tenth of the cost.

A warm `reconcile plan` defines some 60 record classes before it does anything else. typing.NamedTuple
spends ~145 µs on each (collections.namedtuple compiles a `__new__` with `eval`, and typing checks every
annotation); a `Record` class costs ~14 µs. That was 12% of a warm plan (issue 18: 0.878x the time,
A/B interleaved with the floor); an instance costs what a NamedTuple's does (~0.5 µs).

    class ProcId(Record):
        pid: int
        start: int
        boot: str = ""

Type checkers see typing.NamedTuple itself (the TYPE_CHECKING branch below), so mypy checks every record
as the NamedTuple it behaves as. At run time a record is a tuple subclass with the same fields, defaults,
`_fields`, `_field_defaults`, `__match_args__`, `_make`, `_replace`, `_asdict`, repr, equality, hashing,
pickling and errors as the NamedTuple of the same body; tests/test_record.py holds every record class
of the code to that. Annotations are only counted, never evaluated, so a string annotation costs nothing.
A subclass of a record class is an ordinary subclass (as with NamedTuple); it adds no fields.
"""

TYPE_CHECKING = False  # importing typing costs a process ~5 ms; type checkers take this name as True

if TYPE_CHECKING:
    from typing import NamedTuple as Record
else:
    try:
        from _collections import _tuplegetter  # what collections.namedtuple uses: a C descriptor
    except ImportError:  # pragma: no cover - not CPython
        from operator import itemgetter

        def _tuplegetter(index, doc):
            return property(itemgetter(index), doc=doc)

    _tuple_new = tuple.__new__
    _RESERVED = frozenset(
        (
            "__new__",
            "__init__",
            "__slots__",
            "__getnewargs__",
            "_fields",
            "_field_defaults",
            "_make",
            "_replace",
            "_asdict",
            "_source",
        )
    )

    def _annotations(ns):
        if "__annotations__" in ns:
            return ns["__annotations__"]
        # Python 3.14 (PEP 649), in a module without postponed annotations: a function, which the
        # compiler stores as `__annotate_func__` (annotationlib.get_annotate_from_class_namespace's keys)
        annotate = ns.get("__annotate__") or ns.get("__annotate_func__")
        if annotate is None:
            return {}
        try:
            import annotationlib
        except ImportError:  # before 3.14 only a hand-made namespace holds one: its VALUE format
            return annotate(1)
        return annotationlib.call_annotate_function(annotate, annotationlib.Format.FORWARDREF)

    class _RecordType(type):
        def __new__(mcls, name, bases, ns):
            root = globals().get("Record")  # None while Record itself is made
            if root not in bases:  # Record itself, or a subclass of a record class: no new fields
                return super().__new__(mcls, name, bases, ns)
            if bases != (root,):
                raise TypeError("a record class can inherit from Record alone")
            fields = tuple(_annotations(ns))
            defaults = {}
            for field in fields:
                if field.startswith("_"):
                    raise ValueError(f"Field names cannot start with an underscore: {field!r}")
                if field in ns:
                    defaults[field] = ns.pop(field)
                elif defaults:
                    raise TypeError(
                        f"Non-default namedtuple field {field} cannot follow default field"
                        f"{'s' if len(defaults) > 1 else ''} {', '.join(defaults)}"
                    )
            for key in ns:
                if key in _RESERVED:
                    raise AttributeError(f"Cannot overwrite NamedTuple attribute {key}")
            ns["__slots__"] = ()
            ns["_fields"] = fields
            ns["_field_defaults"] = defaults
            ns["__match_args__"] = fields
            ns.setdefault("__doc__", f"{name}({', '.join(fields)})")
            for index, field in enumerate(fields):
                ns[field] = _tuplegetter(index, f"Alias for field number {index}")
            return super().__new__(mcls, name, bases, ns)

    class Record(tuple, metaclass=_RecordType):
        __slots__ = ()
        _fields = ()

        def __new__(cls, *args, **kwargs):
            if not kwargs and len(args) == len(cls._fields):
                return _tuple_new(cls, args)
            return _tuple_new(cls, _bind(cls, args, kwargs))

        @classmethod
        def _make(cls, iterable):
            result = _tuple_new(cls, iterable)
            if len(result) != len(cls._fields):
                raise TypeError(f"Expected {len(cls._fields)} arguments, got {len(result)}")
            return result

        def _replace(self, /, **kwargs):
            result = self._make(map(kwargs.pop, self._fields, self))
            if kwargs:
                raise ValueError(f"Got unexpected field names: {list(kwargs)!r}")
            return result

        def _asdict(self):
            return dict(zip(self._fields, self, strict=True))

        def __repr__(self):
            body = ", ".join(f"{field}={value!r}" for field, value in zip(self._fields, self, strict=True))
            return f"{self.__class__.__name__}({body})"

        def __getnewargs__(self):
            return tuple(self)

    def _bind(cls, args, kwargs):
        """The values of `cls(*args, **kwargs)` in field order, with namedtuple's errors."""
        fields = cls._fields
        name = cls.__name__
        if len(args) > len(fields):
            most, least = len(fields) + 1, len(fields) + 1 - len(cls._field_defaults)
            takes = f"from {least} to {most}" if least < most else f"{most}"
            raise TypeError(
                f"{name}.__new__() takes {takes} positional arguments but {len(args) + 1} were given"
            )
        values = list(args)
        missing = []
        for field in fields[len(args) :]:
            if field in kwargs:
                values.append(kwargs.pop(field))
            elif field in cls._field_defaults:
                values.append(cls._field_defaults[field])
            else:
                missing.append(field)
        for key in kwargs:
            if key in fields:
                raise TypeError(f"{name}.__new__() got multiple values for argument {key!r}")
            raise TypeError(f"{name}.__new__() got an unexpected keyword argument {key!r}")
        if missing:
            quoted = [repr(field) for field in missing]
            # CPython's words: 'a' / 'a' and 'b' / 'a', 'b', and 'c'
            listed = (
                " and ".join(quoted) if len(quoted) < 3 else f"{', '.join(quoted[:-1])}, and {quoted[-1]}"
            )
            raise TypeError(
                f"{name}.__new__() missing {len(missing)} required positional argument"
                f"{'s' if len(missing) > 1 else ''}: {listed}"
            )
        return values


__all__ = ["Record"]
