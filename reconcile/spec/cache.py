"""A per-user cache of validated specs, keyed by the identity of every file a spec reads.

Called by the CLI commands instead of `loading.load_spec`. A converged `reconcile plan` must feel
instant; parsing TOML (tomlkit is pure Python) and validating with pydantic cost more than
everything else a plan does, and a spec rarely changes between two timer ticks. A hit needs the
same absolute path, the same (mtime, size, inode, ctime) of the spec and every base it extends,
and the same reconcile and Python version; anything else is a miss and a full load.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
from typing import Any

from reconcile import __version__
from reconcile.spec.loaded import LoadedSpec

# 2: the spec is stored as spec_view data, not as pydantic objects. 3: specs validated before the
# control-character, env-name, number and system-directory checks must be validated again.
_FORMAT = 3


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "reconcile", "specs")


def _stamp(path: str) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_ctime_ns)


def _entry(abspath: str) -> str:
    key = f"{_FORMAT}\0{__version__}\0{sys.version}\0{abspath}".encode()
    return os.path.join(cache_dir(), hashlib.sha256(key).hexdigest()[:32] + ".pickle")


def _trusted(path: str) -> bool:
    """Only unpickle a file we own that nobody else can write (pickle runs code)."""
    try:
        st = os.stat(path)
        parent = os.stat(os.path.dirname(path))
    except OSError:
        return False
    uid = os.getuid()
    return st.st_uid == uid and parent.st_uid == uid and not (st.st_mode | parent.st_mode) & 0o022


def lookup(path: str) -> LoadedSpec | None:
    entry = _entry(os.path.abspath(path))
    if not _trusted(entry):
        return None
    try:
        with open(entry, "rb") as f:
            stamps, loaded, encoded = pickle.load(f)
    except Exception:
        return None
    if not isinstance(loaded, LoadedSpec) or not isinstance(stamps, dict):
        return None
    from reconcile.spec.view import decode

    loaded = loaded._replace(spec=decode(encoded))
    if any(_stamp(f) != stamp for f, stamp in stamps.items()):
        return None
    if loaded.path != path:  # messages name the path as the user typed it
        loaded = loaded._replace(path=path)
    return loaded


def store(loaded: LoadedSpec) -> None:
    stamps: dict[str, Any] = {f: _stamp(f) for f in loaded.files}
    if any(s is None for s in stamps.values()):
        return
    directory = cache_dir()
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        from reconcile.host import atomic_write
        from reconcile.spec.view import encode

        # The LoadedSpec without its pydantic Spec, which is stored as plain data beside it.
        bare = loaded._replace(spec=None)  # type: ignore[arg-type]
        body = pickle.dumps((stamps, bare, encode(loaded.spec)), protocol=4)
        atomic_write(_entry(loaded.files[0]), body, mode=0o600)
    except OSError:
        pass  # a read-only home only costs speed


def load(path: str) -> LoadedSpec:
    """The spec at `path`, from the cache when no file it reads has changed."""
    hit = lookup(path)
    if hit is not None:
        return hit
    from reconcile.spec.loader import load_spec

    loaded = load_spec(path)
    store(loaded)
    return loaded
