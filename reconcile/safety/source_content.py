"""How a local model source is compared with what was copied from it: a stamp (size, mtime, inode,
ctime) per file and the sha256 of its bytes, recorded at copy in the model dir's download record.

Used by actions.model_copying (records, and skips a file only when it provably did not change) and
probes.model_source (the planner's drift). A changed stamp means "hash it again", never "copy it".
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from reconcile.safety.untrusted import open_regular, sha256_fd, source_roots

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    Entry = Mapping[str, Any]  # {"size", "mtime_ns", "ino", "ctime_ns", "sha256"}


# reconcile's own records in a model dir or realization: the download record, the config backup, the
# realization's seal. Never taken from a source tree (another user's data would choose what the record
# says: a forged seal keeps the snapshot it names from gc, and stops the realization being sealed).
RESERVED = frozenset({".reconcile-model.json", "config.json.bak", ".reconcile-realization.json"})


def reserved(rel: str) -> bool:
    """`rel` (a "/"-separated name relative to the source) is one of reconcile's own record names."""
    return rel in RESERVED


def selected(name: str, patterns: Iterable[str]) -> bool:
    """snapshot_download's allow_patterns rule: fnmatch, and a trailing "/" means everything below."""
    patterns = list(patterns)
    if not patterns:
        return True
    from fnmatch import fnmatchcase  # only with patterns: a plan's model source mostly has none

    return any(fnmatchcase(name, p + "*" if p.endswith("/") else p) for p in patterns)


def sha256_file(path: str, tree: str) -> str:
    """The sha256 of a file of source `tree`, opened as data (untrusted.open_regular: a FIFO or device
    raises NotRegular, never blocks), as big as fstat saw it, and only when the descriptor opened lies
    inside the tree (a link out, or one put there since the walk, is NotRegular, never read)."""
    fd, st = open_regular(os.path.realpath(path), inside=source_roots(tree))
    try:
        return sha256_fd(fd, st.st_size)
    finally:
        os.close(fd)


def entry(st: os.stat_result, digest: str) -> dict[str, Any]:
    """What the record keeps for one source file."""
    return {
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ino": st.st_ino,
        "ctime_ns": st.st_ctime_ns,
        "sha256": digest,
    }


def same_stamp(recorded: Entry | None, st: os.stat_result) -> bool:
    """The file is the one hashed at copy: same size, mtime, inode and ctime (else hash it again).
    ctime too: an in-place edit that puts the old mtime back (touch -r, rsync -t) still moves it."""
    return (
        isinstance(recorded, Mapping)
        and recorded.get("size") == st.st_size
        and recorded.get("mtime_ns") == st.st_mtime_ns
        and recorded.get("ino") == st.st_ino
        and recorded.get("ctime_ns") == st.st_ctime_ns
    )


def content_changed(path: str, tree: str, recorded: Entry | None, st: os.stat_result) -> bool | None:
    """True: its bytes differ from those copied; False: same bytes (perhaps touched); None: its
    stamp is the recorded one, so it was not hashed at all (the cheap, usual case)."""
    if same_stamp(recorded, st):
        return None
    return not isinstance(recorded, Mapping) or recorded.get("sha256") != sha256_file(path, tree)
