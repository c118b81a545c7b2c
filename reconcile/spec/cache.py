"""A per-user cache of validated specs, keyed on the content of every file a spec reads.

Called by the CLI commands instead of `loader.load_spec`. A converged `reconcile plan` must feel
instant; parsing TOML and validating with pydantic cost more than everything else a plan does, and
a spec rarely changes between two timer ticks. A hit needs the same absolute path, the same TOML
content (reconcile.spec.key: comments and layout aside) of the spec and of every base it extends,
and the same reconcile and Python version; anything else is a miss and a full load. So a touch, a
checkout or a comment edit is a hit. A file whose (inode, size, mtime, ctime) are still those it had
when it was keyed is not lexed again (any write changes its ctime).

The entries are `marshal` data (reconcile.private_cache: loading one runs no code, unlike pickle),
read only from a regular file that this user owns with mode 0600, in a directory this user owns with
mode 0700. A damaged or foreign entry is a miss, never an error. A spec holding a secret inline
(safety.sensitive.secret_paths) is never stored: better, keep it in [server] secret_files.
"""

from __future__ import annotations

import os
import sys
import zlib

from reconcile import __version__, private_cache
from reconcile.errors import ReconcileError
from reconcile.spec.key import content_key
from reconcile.spec.loaded import LoadedSpec
from reconcile.spec.provenance import read_trusted

# 2: spec_view data, not pydantic objects. 3: validated again after new checks. 4: marshal, keyed
# on content (3 and before: pickle, keyed on (mtime, size, inode, ctime)). 5: + each file's stamp.
# 6: + the stamps of the code that validates (an upgrade in place keeps __version__).
_FORMAT = 6
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CODE = tuple(os.path.join(_PACKAGE, p) for p in ("spec", "safety", "errors.py", "__init__.py"))


def _head(abspath: str) -> tuple[object, ...]:
    """What a hit needs besides the files' content: the same reconcile (its validating code, stat by
    stat: a new check must see the spec), pydantic, Python, and the same absolute path."""
    code = private_cache.tree_stamps(_CODE) + private_cache.package_stamps("pydantic", ("version.py",))
    return (_FORMAT, __version__, sys.version, code, abspath)


def cache_dir() -> str:
    return os.path.join(private_cache.cache_root(), "specs")


def _entry(abspath: str) -> str:
    # Only an index: the entry itself names its spec's path and is checked against it. crc32 keeps
    # hashlib (~3-5 ms to import, for OpenSSL) off the warm path; a clash only shares a slot.
    name = f"{zlib.crc32(abspath.encode('utf-8', 'surrogateescape')):08x}-{len(abspath)}.marshal"
    return os.path.join(cache_dir(), name)


def _key(text: str) -> tuple[int, str]:
    """(1, the content key) or, when the text does not lex, (0, the whole text)."""
    key = content_key(text)
    return (0, text) if key is None else (1, key)


def _read_text(path: str) -> str | None:
    """The file's text, read as the loader reads it (provenance: only a file that root or we alone can
    change); None otherwise, a miss: the full load then says what is wrong."""
    try:
        raw = read_trusted(path, path)
        # utf-8-sig's decoding (a leading BOM dropped), without importing its codec (~0.3 ms)
        return None if raw is None else raw.removeprefix(b"\xef\xbb\xbf").decode("utf-8")
    except (ReconcileError, UnicodeDecodeError):
        return None


def lookup(path: str) -> LoadedSpec | None:
    abspath = os.path.abspath(path)
    data = private_cache.read(_entry(abspath))
    try:
        head, keys, (sha256, files, resolved), encoded, stamps = data
        if head != _head(abspath) or len(keys) != len(files) or not files:
            return None
        texts = [_read_text(f) for f in files]
        # The same file untouched since it was keyed (any write changes its ctime) needs no lexing.
        if any(
            t is None or ((stamp is None or private_cache.stamp(f) != tuple(stamp)) and _key(t) != tuple(k))
            for t, k, f, stamp in zip(texts, keys, files, stamps, strict=True)
        ):
            return None
        if not isinstance(sha256, str) or not isinstance(resolved, dict) or not isinstance(files, tuple):
            return None
        from reconcile.spec.view import decode

        spec = decode(encoded)
    except Exception:  # not the shape we write: a miss
        return None
    # The path as the user typed it (messages name it), and the main file's text as it is now
    # (generations record it: a comment edit shows there).
    return LoadedSpec(spec, path, texts[0] or "", sha256, files, resolved)


def store(loaded: LoadedSpec, texts: tuple[str, ...]) -> None:
    """Remember `loaded`; `texts` are the texts it was loaded from, the spec's first, then its bases'."""
    if len(texts) != len(loaded.files):
        return
    from reconcile.safety.sensitive import secret_paths

    if secret_paths(loaded.resolved):
        return  # a secret is kept only as a hash at rest: such a spec is loaded in full every time
    from reconcile.spec.view import encode

    head = _head(loaded.files[0])
    body = (loaded.sha256, tuple(loaded.files), loaded.resolved)
    keys = tuple(_key(t) for t in texts)
    stamps = tuple(_held_stamp(f, t) for f, t in zip(loaded.files, texts, strict=True))
    # A value marshal cannot hold (a TOML date in a free-form table) leaves the spec uncached.
    private_cache.write(_entry(loaded.files[0]), (head, keys, body, encode(loaded.spec), stamps))


def _held_stamp(path: str, text: str) -> tuple[int, int, int, int] | None:
    """The file's stamp if it holds `text` (the text validated) now, else None: its content key
    decides then. Stamped before and after the read: any write between changes the ctime."""
    before = private_cache.stamp(path)
    return before if _read_text(path) == text and private_cache.stamp(path) == before else None


def load(path: str) -> LoadedSpec:
    """The spec at `path`, from the cache when no file it reads has changed its content."""
    hit = lookup(path)
    if hit is not None:
        return hit
    from reconcile.spec.loader import load_spec_and_texts

    loaded, texts = load_spec_and_texts(path)
    store(loaded, texts)
    return loaded
