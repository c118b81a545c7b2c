"""SHA-256 of small inputs (identities, spec digests, lock pins) without importing hashlib.

Called on the start-up path by identity, spec.pins, spec.loader, safety and ownership. hashlib
loads OpenSSL (~5 ms per process); CPython's own `_sha256` (`_sha2` from 3.12) is the same function
and costs ~0.3 ms. Large inputs (downloaded weights) keep using hashlib, which is faster per byte.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing itself is not imported at run time (reconcile/record.py says why)
if TYPE_CHECKING:
    from typing import Any


try:  # no typeshed stubs for these private modules: typed here by use
    from _sha2 import sha256 as _sha256  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    try:
        from _sha256 import sha256 as _sha256  # type: ignore[import-not-found,no-redef,unused-ignore]
    except ImportError:  # a build without them: the same function through OpenSSL
        from hashlib import sha256 as _sha256  # type: ignore[assignment,unused-ignore]


def sha256_hex(data: str | bytes) -> str:
    """The hex SHA-256 of `data` (a str as UTF-8)."""
    h: Any = _sha256(data.encode() if isinstance(data, str) else data)
    hexdigest: str = h.hexdigest()
    return hexdigest
