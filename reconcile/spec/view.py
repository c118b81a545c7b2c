"""A plain, read-only twin of a validated Spec, for the spec cache.

Called by reconcile.spec.cache. pydantic costs ~110 ms to import, more than the rest of a converged
`reconcile plan`; a spec that validated once and has not changed since is read back as these
views, so a cache hit never imports pydantic. Views answer the attribute reads the code makes,
plus model_copy()/model_dump(); anything that must validate loads the real Spec instead.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


_VIEW = "view"  # tag of an encoded model: (_VIEW, {field: value}); TOML and pydantic never give tuples


class SpecView:
    """One model's fields as attributes. Frozen: assignment raises, like the models it mirrors."""

    __slots__ = ("_fields",)

    def __init__(self, fields: dict[str, Any]) -> None:
        object.__setattr__(self, "_fields", fields)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy/pickle probe dunders before the slot is set
            raise AttributeError(name)
        try:
            return self._fields[name]
        except KeyError:
            raise AttributeError(name) from None

    def __reduce__(self) -> tuple[Any, ...]:
        return (SpecView, (self._fields,))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SpecView) and self._fields == other._fields

    __hash__ = None  # type: ignore[assignment]  # equal by value, so not hashable by identity

    def __repr__(self) -> str:
        return f"SpecView({self._fields!r})"

    def model_copy(self, *, update: dict[str, Any] | None = None) -> SpecView:
        return SpecView({**self._fields, **(update or {})})

    def model_dump(self) -> dict[str, Any]:
        return {k: _dump(v) for k, v in self._fields.items()}


def _dump(value: Any) -> Any:
    if isinstance(value, SpecView):
        return value.model_dump()
    if isinstance(value, list):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value


def encode(value: Any) -> Any:
    """A validated model as plain data (models tagged, dicts and lists as they are)."""
    fields = getattr(type(value), "model_fields", None)
    if fields is not None:
        return (_VIEW, {name: encode(getattr(value, name)) for name in fields})
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {k: encode(v) for k, v in value.items()}
    return value


def decode(value: Any) -> Any:
    if isinstance(value, tuple) and len(value) == 2 and value[0] == _VIEW:
        return SpecView({k: decode(v) for k, v in value[1].items()})
    if isinstance(value, list):
        return [decode(v) for v in value]
    if isinstance(value, dict):
        return {k: decode(v) for k, v in value.items()}
    return value
