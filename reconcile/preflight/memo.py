"""The preflight rules' findings remembered, keyed on every input they read, so that a converged plan
imports neither the rule modules nor the vLLM engine (~12 ms, a sixth of a warm plan).

Called by reconcile.preflight.gather. The rules are pure functions of the spec, the plain facts the
planner gathered (PreflightInputs) and the code and data tables they ship with; the key is all of
them: the spec and the inputs as exact, type-tagged marshal data, this interpreter and kernel (the
requirement markers judge the platform), and the stat of every file of reconcile/preflight,
reconcile/vllm, reconcile/data and the `packaging` they call. A hit needs the key byte for byte;
a value the key cannot spell (an object of no known kind) is never remembered. The entry is a
private marshal file (reconcile.private_cache: 0600 in 0700, ours, or a miss); damaged is a miss.
A spec that holds a secret inline is never remembered (the key would keep it in clear).
"""

from __future__ import annotations

import contextlib
import marshal
import os
import sys
import zlib
from collections.abc import Callable
from types import MappingProxyType

from reconcile import __version__, private_cache
from reconcile.plan.records import Finding

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from reconcile.preflight.context import PreflightInputs
    from reconcile.spec.models import Spec

_FORMAT = 1
_HERE = os.path.dirname(os.path.abspath(__file__))
_PACKAGE = os.path.dirname(_HERE)
# What the rules run and read: the rule modules, the engine, the data tables, and Finding itself.
_CODE = (_HERE, os.path.join(_PACKAGE, "vllm"), os.path.join(_PACKAGE, "data"))
_RECORDS = os.path.join(_PACKAGE, "plan", "records.py")


class _Unspellable(Exception):
    """A value of a kind the key (or the stored findings) cannot hold exactly."""


_SCALARS = (type(None), bool, int, float, str, bytes)


def _spell(value: Any, records: bool = True) -> Any:
    """`value` as marshal data that tells every type apart: equal bytes only for equal values of the
    same types (1, 1.0 and True differ; so do a tuple and a list, a dict and a mapping proxy).
    `records`: records (by class) and the spec's models (by field) are spelled too."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is list or kind is tuple:
        return ("l" if kind is list else "t", tuple(_spell(v, records) for v in value))
    if kind is dict or kind is MappingProxyType:
        return (
            "d" if kind is dict else "m",
            tuple((_spell(k, records), _spell(v, records)) for k, v in value.items()),
        )
    if kind is frozenset or kind is set:
        # Sorted: one order whatever the hash seed (a set's iteration order is the seed's).
        items = sorted(marshal.dumps(_spell(v, records), 2) for v in value)
        return ("f" if kind is frozenset else "s", tuple(items))
    if not records:
        raise _Unspellable(kind.__name__)
    if isinstance(value, tuple) and hasattr(kind, "_fields"):  # a record: its class and fields
        return ("r", f"{kind.__module__}.{kind.__qualname__}", tuple(_spell(v) for v in value))
    fields = getattr(kind, "model_fields", None)  # the spec (pydantic) and its cached twin alike
    if fields is not None:
        return ("v", tuple((name, _spell(getattr(value, name))) for name in fields))
    if kind.__name__ == "SpecView" and kind.__module__ == "reconcile.spec.view":
        return ("v", tuple((name, _spell(v)) for name, v in value._fields.items()))
    raise _Unspellable(kind.__name__)


def _unspell(data: Any) -> Any:
    """The findings' values back, each of the type it was spelled from (records are not stored)."""
    if not isinstance(data, tuple):
        return data
    tag, body = data
    if tag == "l":
        return [_unspell(v) for v in body]
    if tag == "t":
        return tuple(_unspell(v) for v in body)
    if tag in ("d", "m"):
        out = {_unspell(k): _unspell(v) for k, v in body}
        return out if tag == "d" else MappingProxyType(out)
    if tag in ("f", "s"):
        items = [_unspell(marshal.loads(v)) for v in body]
        return frozenset(items) if tag == "f" else set(items)
    raise ValueError(tag)


def _stamps() -> tuple[tuple[str, int, int, int], ...]:
    """(path, size, mtime, inode) of every file the rules' results can depend on: an edit, an
    upgrade or a checkout of any of them is a miss."""
    out = private_cache.tree_stamps((_RECORDS, *_CODE))
    # The requirement markers' evaluator (the features rule), without importing it.
    return (*out, *private_cache.package_stamps("packaging", ("markers.py", "requirements.py")))


def _key(spec: Spec, inputs: PreflightInputs) -> bytes:
    head = (_FORMAT, __version__, sys.version, sys.executable, tuple(os.uname()), _stamps())
    return marshal.dumps((head, _spell(spec), _spell(inputs)), 2)


def _entry(spec: Spec) -> str:
    # One slot per deployment (a new key overwrites it); the key inside is what is compared.
    where = f"{spec.machine.state_dir}\0{getattr(spec.server, 'name', '')}"
    name = f"{zlib.crc32(where.encode('utf-8', 'surrogateescape')):08x}.marshal"
    return os.path.join(private_cache.cache_root(), "preflight", name)


def _spell_findings(found: tuple[Finding, ...]) -> tuple[Any, ...]:
    if any(type(f) is not Finding for f in found):
        raise _Unspellable("not a Finding")
    return tuple(_spell(tuple(f), records=False) for f in found)


def _holds_secrets(spec: Spec) -> bool:
    """Whether the spec holds a secret inline, as safety.sensitive.secret_paths finds in its document."""
    from reconcile.safety.sensitive import has_credentials, is_secret_name

    server, venv = spec.server, spec.venv
    if server is not None and any(is_secret_name(name, server.secret_env) for name in server.env):
        return True
    urls = [venv.index_url, *venv.extra_index_urls] if venv is not None else []
    return any(url is not None and has_credentials(url) for url in urls)


def remembered(
    spec: Spec, inputs: PreflightInputs, compute: Callable[[], tuple[Finding, ...]]
) -> tuple[Finding, ...]:
    """`compute()`'s findings, from the memo when the spec, the inputs and the rules' code are the same."""
    if _holds_secrets(spec):
        return compute()  # the key spells the spec, and a secret is kept only as a hash at rest
    try:
        key = _key(spec, inputs)
    except (_Unspellable, ValueError):
        return compute()
    entry = _entry(spec)
    data = private_cache.read(entry)
    try:
        if isinstance(data, tuple) and len(data) == 2 and data[0] == key:
            return tuple(Finding(*_unspell(f)) for f in data[1])
    except Exception:  # not the shape we write: a miss
        pass
    found = compute()
    # Evidence of a kind the memo cannot give back exactly is not stored: computed every time.
    with contextlib.suppress(_Unspellable, ValueError):
        private_cache.write(entry, (key, _spell_findings(found)))
    return found
