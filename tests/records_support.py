"""Records are tuples: `Unavailable("x") == ProbeFailure("x") == ("x", "")` and `Absent(p) == (p,)`.
A test that means one state compares the type as well."""

from __future__ import annotations


def same(found: object, expected: object) -> bool:
    """`found` is `expected`'s type and equal to it."""
    return type(found) is type(expected) and found == expected
