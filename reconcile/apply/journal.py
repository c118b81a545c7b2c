"""The apply journal: one record per apply, `<state_dir>/generations/N.json`, written 0600 in a
0700 dir with every secret kept as a hash, and read back only when verified by the hash reconcile
keeps for each in `generations/index.json` (0600).
Called by the executor (write) and history, diff and rollback (read).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
from collections.abc import Mapping

from reconcile.errors import ReconcileError
from reconcile.host import atomic_write
from reconcile.safety import statefiles
from reconcile.safety.filesafety import PRIVATE_DIR, PRIVATE_FILE, ensure_dir, parent_problem
from reconcile.safety.untrusted import load_json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

INDEX = "index.json"
_GEN = re.compile(r"^(\d+)\.json\Z")


class UnverifiedGeneration(ReconcileError):
    """A record reconcile cannot vouch for (not in its index, or changed since), or a malformed one."""


def generations_dir(state_dir: str) -> str:
    return os.path.join(state_dir, "generations")


def generation_path(state_dir: str, number: int) -> str:
    return os.path.join(generations_dir(state_dir), f"{number}.json")


def list_generations(state_dir: str) -> list[int]:
    """The numbers of the records present, verified or not (read_generation verifies)."""
    try:
        names = os.listdir(generations_dir(state_dir))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(int(m.group(1)) for n in names if (m := _GEN.match(n)))


def record_digest(data: bytes) -> str:
    """What the index keeps per record: the sha256 of its bytes as written."""
    return hashlib.sha256(data).hexdigest()


def _read_private(path: str) -> bytes:
    """A record's bytes (reconcile.safety.statefiles: never through a symlink, a regular file only,
    bounded; anything else is moved aside), only when root or we own it and nobody else can write it
    (else UnverifiedGeneration naming it). FileNotFoundError when there is none."""
    got = statefiles.read_record(path)
    if got is None:
        raise FileNotFoundError(errno.ENOENT, "no such file", path)
    raw, st = got
    if st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
        raise UnverifiedGeneration(
            f"{path}: not verified (owned by uid {st.st_uid}, mode {st.st_mode & 0o777:04o}): "
            "not a file reconcile wrote"
        )
    return raw


def read_index(state_dir: str) -> dict[int, str] | None:
    """number -> record_digest, as reconcile wrote it; None when there is no index yet. A damaged one
    is moved aside and a new one starts empty: the records it vouched for are not verified again."""
    return statefiles.read_generations_index(os.path.join(generations_dir(state_dir), INDEX))


def _write_index(state_dir: str, index: Mapping[int, str]) -> None:
    body = {"format": "reconcile-generations/1", "records": {str(k): v for k, v in sorted(index.items())}}
    path = os.path.join(generations_dir(state_dir), INDEX)
    atomic_write(path, (json.dumps(body, indent=2) + "\n").encode(), mode=PRIVATE_FILE)


def _adopt_existing(state_dir: str) -> dict[int, str]:
    """The first index: records an older reconcile wrote, where only root or we could have (the file
    and every directory above it owned by root or us and not writable by others)."""
    index: dict[int, str] = {}
    for number in list_generations(state_dir):
        path = generation_path(state_dir, number)
        if parent_problem(path) is not None:
            continue
        try:
            index[number] = record_digest(_read_private(path))
        except (OSError, ReconcileError):
            continue
    return index


def check_record(data: object) -> str | None:
    """What is wrong with a record's shape for history, diff and rollback (None: nothing)."""
    return statefiles.record_problem(data, statefiles.GENERATION_RECORD)


def read_generation(state_dir: str, number: int) -> dict[str, Any]:
    """Generation `number`, verified against the index and checked for shape; UnverifiedGeneration
    (one line naming the record and the way out) otherwise."""
    path = generation_path(state_dir, number)
    try:
        raw = _read_private(path)
    except FileNotFoundError:
        have = list_generations(state_dir)
        raise ReconcileError(
            f"{path}: no generation {number} (have: {', '.join(map(str, have)) or 'none'})"
        ) from None
    except OSError as exc:
        raise UnverifiedGeneration(f"{path}: cannot read it ({exc.strerror})") from None
    index = read_index(state_dir)
    if index is None:
        index = _adopt_existing(state_dir)
    if index.get(number) != record_digest(raw):
        why = "its hash differs from the one kept" if number in index else "reconcile kept no hash of it"
        raise UnverifiedGeneration(
            f"{path}: not verified ({why} in {INDEX}): reconcile uses only generation records it wrote"
        )
    try:
        data = load_json(raw)
    except ValueError as exc:
        raise UnverifiedGeneration(f"{path}: not valid JSON ({exc})") from None
    problem = check_record(data)
    if problem is not None:
        raise UnverifiedGeneration(f"{path}: malformed generation record: {problem}")
    return data  # type: ignore[no-any-return]  # check_record: a dict


def write_generation(state_dir: str, record: Mapping[str, Any], number: int | None = None) -> int:
    """Store `record` as generation `number` (rewriting it), by default the next one; returns it.

    Secrets are replaced by their hashes (reconcile.safety.sensitive.redact_generation); the file is 0600 in
    0700 directories, and its hash goes into the index that read_generation verifies against."""
    from reconcile.safety.sensitive import redact_generation

    ensure_dir(state_dir, PRIVATE_DIR)
    statefiles.clear_non_dir(generations_dir(state_dir), then=statefiles.NEW_DIR)  # a FIFO there: aside
    ensure_dir(generations_dir(state_dir), PRIVATE_DIR)
    index = read_index(state_dir)
    if index is None:
        index = _adopt_existing(state_dir)
    if number is None:
        number = max([0, *list_generations(state_dir), *index]) + 1
    body = redact_generation(record)
    body["generation"] = number
    data = (json.dumps(body, indent=2, sort_keys=False, default=str) + "\n").encode()
    # Index first: a record on disk without its hash would be refused; a hash without its record is not.
    index[number] = record_digest(data)
    _write_index(state_dir, index)
    atomic_write(generation_path(state_dir, number), data, mode=PRIVATE_FILE)
    return number
