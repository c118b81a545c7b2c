"""The machine's generations (a spec with [deployments]): each names every deployment's generation at
one moment, as a NixOS generation names the whole system; `changed` says which deployments moved.

Kept in `<state_dir>/machine-profile/` (files 0600, the directory 0700, whatever the umask), verified
by `index.json`'s sha256 like the deployments' own profiles (reconcile.apply.generations). Recorded by
`sync` at the end of every command that switches a deployment of the machine (apply, rollback), under
the machine's apply lock; read by the history, diff and rollback commands (reconcile.commands.machine).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping

from reconcile.apply import generations
from reconcile.errors import ReconcileError
from reconcile.host import atomic_write
from reconcile.safety import statefiles
from reconcile.safety.filesafety import PRIVATE_DIR, ensure_dir
from reconcile.safety.untrusted import load_json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MACHINE_PROFILE = "machine-profile"
INDEX = "index.json"


def profile_dir(machine_dir: str) -> str:
    return os.path.join(machine_dir, MACHINE_PROFILE)


def _dump(data: Any) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def read_index(machine_dir: str) -> dict[str, Any]:
    return statefiles.read_machine_index(os.path.join(profile_dir(machine_dir), INDEX))


def numbers(machine_dir: str) -> list[int]:
    """The generations the index vouches for, oldest first."""
    return sorted(int(n) for n in read_index(machine_dir)["records"] if n.isdigit())


def read(machine_dir: str, number: int, index: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Machine generation `number`, refused unless its bytes hash to what the index says and it has a
    record's shape."""
    index = read_index(machine_dir) if index is None else index
    path = os.path.join(profile_dir(machine_dir), f"{number}.json")
    got = statefiles.read_record(path)
    if got is None or str(number) not in index["records"]:
        have = ", ".join(map(str, numbers(machine_dir))) or "none"
        raise generations.NoGeneration(f"{path}: no machine generation {number} (have: {have})")
    if index["records"][str(number)] != hashlib.sha256(got[0]).hexdigest():
        raise ReconcileError(
            f"{path}: its sha256 is not the one reconcile recorded in {INDEX}: it was changed by "
            "something else; it is not used (move it aside)"
        )
    try:
        data = load_json(got[0])
    except ValueError:
        data = None
    problem = statefiles.record_problem(data, statefiles.MACHINE_RECORD)
    if problem is not None:
        raise ReconcileError(f"{path}: malformed machine generation record: {problem}")
    return data  # type: ignore[no-any-return]  # MACHINE_RECORD: an object


def scan(machine_dir: str) -> list[tuple[int, dict[str, Any] | str]]:
    """Every machine generation, oldest first: its record, or why it is not used."""
    index = read_index(machine_dir)
    out: list[tuple[int, dict[str, Any] | str]] = []
    for n in numbers(machine_dir):
        try:
            out.append((n, read(machine_dir, n, index)))
        except ReconcileError as exc:
            out.append((n, str(exc)))
    return out


def current(machine_dir: str) -> int | None:
    value = read_index(machine_dir).get("current")
    return value if isinstance(value, int) else None


def now(machine_dir: str, names: list[str]) -> dict[str, int]:
    """Every deployment's current generation (its profile index's), by name; one with none is left out."""
    from reconcile.spec.deployments import state_dir_of

    out = {}
    for name in names:
        number = generations.current(state_dir_of(machine_dir, name))
        if number is not None:
            out[name] = number
    return out


def record(machine_dir: str, deployments: Mapping[str, int], *, reason: str) -> tuple[int, bool] | None:
    """Make `deployments` (name -> generation) the machine's current generation: the newest that has
    exactly it, else a new one whose `changed` lists the deployments that differ from the current one.
    None when no deployment has a generation yet. Returns (number, whether it is new)."""
    if not deployments:
        return None
    index = read_index(machine_dir)
    found = scan(machine_dir)
    then = index.get("current")
    for n, g in reversed(found):
        if not isinstance(g, str) and g["deployments"] == dict(deployments):
            if then != n:
                index["current"] = n
                _write_index(machine_dir, index)
            return n, False
    before: Mapping[str, int] = {}
    for n, g in found:
        if n == then and not isinstance(g, str):
            before = g["deployments"]
    changed = sorted(
        name for name in set(deployments) | set(before) if deployments.get(name) != before.get(name)
    )
    directory = profile_dir(machine_dir)
    statefiles.clear_non_dir(directory, then=statefiles.NEW_DIR)  # a FIFO, file, link there: aside
    ensure_dir(directory, PRIVATE_DIR)  # 0700 whatever the umask
    number = max([0, *(n for n, _ in found)]) + 1
    while os.path.exists(os.path.join(directory, f"{number}.json")):  # left by a damaged index
        number += 1
    body = {
        "generation": number,
        "created": time.time(),
        "reason": reason,
        "deployments": dict(sorted(deployments.items())),
        "changed": changed,
    }
    raw = _dump(body)
    atomic_write(os.path.join(directory, f"{number}.json"), raw, mode=0o600)
    index["records"][str(number)] = hashlib.sha256(raw).hexdigest()
    index["current"] = number
    _write_index(machine_dir, index)
    return number, True


def _write_index(machine_dir: str, index: Mapping[str, Any]) -> None:
    directory = profile_dir(machine_dir)
    statefiles.clear_non_dir(directory, then=statefiles.NEW_DIR)  # a FIFO, file, link there: aside
    ensure_dir(directory, PRIVATE_DIR)
    atomic_write(os.path.join(directory, INDEX), _dump(index), mode=0o600)


def sync(machine_dir: str, names: list[str], *, reason: str) -> tuple[int, bool] | None:
    """After a command switched deployments of the machine (under its apply lock): record the whole
    machine as it now is (every deployment's current generation)."""
    return record(machine_dir, now(machine_dir, names), reason=reason)
