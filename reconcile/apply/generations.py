"""Generations (the profile): each the realized state serving depends on, one record per distinct state.

Kept in `<state_dir>/profile/` (files 0600, the directory 0700, whatever the umask); `index.json`
holds each record's sha256, the current generation and the hold, and a record that does not match
it is refused. Written and read by reconcile.apply.switching and the history/diff/rollback commands.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Collection, Mapping

from reconcile.errors import ReconcileError
from reconcile.host import atomic_write
from reconcile.record import Record
from reconcile.safety import statefiles
from reconcile.safety.filesafety import PRIVATE_DIR, ensure_dir
from reconcile.safety.untrusted import load_json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from reconcile.safety.shapes import Shape

PROFILE = "profile"
INDEX = "index.json"
_RECORD = r"^(\d+)\.json\Z"  # compiled on first use (by re's cache), not on import


# --- secrets: reconcile.safety.sensitive decides (the same module issue 13 brings) ------------------


def scrub_env(env: Mapping[str, str], marked: Collection[str] = ()) -> dict[str, str]:
    """An environment fit to keep: secret values as their hash placeholder, URL credentials too."""
    from reconcile.safety.sensitive import is_secret_name, placeholder, redact_url  # records, not plans

    return {k: placeholder(v) if is_secret_name(k, marked) else redact_url(v) for k, v in sorted(env.items())}


# --- the profile directory -------------------------------------------------------------------


def profile_dir(state_dir: str) -> str:
    return os.path.join(state_dir, PROFILE)


def _ensure_dir(state_dir: str) -> str:
    path = profile_dir(state_dir)
    statefiles.clear_non_dir(path, then=statefiles.NEW_DIR)  # a FIFO, file, link there: aside
    ensure_dir(path, PRIVATE_DIR)  # 0700 whatever the umask; an older, wider one is narrowed
    return path


def _write(path: str, data: bytes, shape: Shape | None = None, max_bytes: int = statefiles.RECORD) -> None:
    """Written only when its reader (statefiles.read_record, read_profile_index) reads it back: a
    record or config holding values from outside is refused here, named, not kept to be moved aside."""
    why = statefiles.unreadable(data, max_bytes=max_bytes, shape=shape)
    if why is not None:
        raise ReconcileError(f"{path}: not written: it {why}")
    atomic_write(path, data, mode=0o600)


def _dump(data: Any) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True, default=str) + "\n").encode()


def read_index(state_dir: str) -> dict[str, Any]:
    """The index; a damaged one is moved aside and reads as empty (reconcile.safety.statefiles):
    records then fail verification and are skipped, nothing wedges."""
    return statefiles.read_profile_index(os.path.join(profile_dir(state_dir), INDEX))


def _write_index(state_dir: str, index: Mapping[str, Any]) -> None:
    _write(os.path.join(_ensure_dir(state_dir), INDEX), _dump(index), statefiles.PROFILE_INDEX)


def numbers(state_dir: str) -> list[int]:
    try:
        names = os.listdir(profile_dir(state_dir))
    except OSError:
        return []
    return sorted(int(m.group(1)) for n in names if (m := re.match(_RECORD, n)))


class NoGeneration(ReconcileError):
    """No record of that number (or what was there was not a file, and is moved aside)."""


def read(state_dir: str, number: int, index: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Generation `number`, refused unless its bytes hash to what the index says reconcile wrote and
    it has a record's shape."""
    index = read_index(state_dir) if index is None else index
    path = os.path.join(profile_dir(state_dir), f"{number}.json")
    got = statefiles.read_record(path)  # something else than a file there is moved aside
    if got is None:
        have = ", ".join(map(str, numbers(state_dir))) or "none"
        raise NoGeneration(f"{path}: no generation {number} (have: {have})")
    raw = got[0]
    if index["records"].get(str(number)) != hashlib.sha256(raw).hexdigest():
        raise ReconcileError(
            f"{path}: its sha256 is not the one reconcile recorded in {INDEX}: it was changed by "
            "something else; it is not used (move it aside)"
        )
    try:
        data = load_json(raw)
    except ValueError:
        data = None
    problem = statefiles.record_problem(data, statefiles.PROFILE_RECORD)
    if problem is not None:
        raise ReconcileError(f"{path}: malformed generation record: {problem}")
    return data  # type: ignore[no-any-return]  # PROFILE_RECORD: an object


def scan(state_dir: str) -> list[tuple[int, dict[str, Any] | str]]:
    """Every generation present, oldest first: its record when it verifies, else why not (history
    lists it as skipped)."""
    index = read_index(state_dir)
    out: list[tuple[int, dict[str, Any] | str]] = []
    for n in numbers(state_dir):
        try:
            out.append((n, read(state_dir, n, index)))
        except NoGeneration:  # gone meanwhile, or not a file (moved aside, and said so)
            continue
        except ReconcileError as exc:
            out.append((n, str(exc)))
    return out


def read_all(state_dir: str) -> list[dict[str, Any]]:
    """Every generation that verifies, oldest first."""
    return [g for _, g in scan(state_dir) if not isinstance(g, str)]


def _store(state_dir: str, record: dict[str, Any]) -> None:
    index = read_index(state_dir)
    raw = _dump(record)
    path = os.path.join(_ensure_dir(state_dir), f"{record['generation']}.json")
    _write(path, raw, statefiles.PROFILE_RECORD)
    index["records"][str(record["generation"])] = hashlib.sha256(raw).hexdigest()
    _write_index(state_dir, index)


def current(state_dir: str) -> int | None:
    value = read_index(state_dir).get("current")
    return value if isinstance(value, int) else None


def set_current(state_dir: str, number: int) -> None:
    index = read_index(state_dir)
    if index.get("current") != number:
        index["current"] = number
        _write_index(state_dir, index)


def record(state_dir: str, state: Mapping[str, Any], *, reason: str) -> tuple[int, bool]:
    """Make `state` current: the generation that already has its `key`, else a new one.
    Returns (number, whether it is new)."""
    for existing in reversed(read_all(state_dir)):
        if existing.get("key") == state["key"]:
            set_current(state_dir, int(existing["generation"]))
            return int(existing["generation"]), False
    number = (numbers(state_dir) or [0])[-1] + 1
    body = {**state, "generation": number, "created": time.time(), "reason": reason, "verdict": None}
    _store(state_dir, body)
    set_current(state_dir, number)
    return number, True


def set_verdict(state_dir: str, number: int, good: bool, why: str) -> None:
    """Whether the generation served: passed readiness and the acceptance check (or why not)."""
    body = read(state_dir, number)
    body["verdict"] = {"good": good, "why": why, "at": time.time()}
    _store(state_dir, body)


def last_good(state_dir: str, *, other_than: int | None = None) -> dict[str, Any] | None:
    """The newest generation that passed its check; failing that, the newest never judged bad."""
    records = [g for g in read_all(state_dir) if g["generation"] != other_than]
    good = [g for g in records if (g.get("verdict") or {}).get("good") is True]
    unjudged = [g for g in records if g.get("verdict") is None]
    found = good or unjudged
    return found[-1] if found else None


def keep_config(state_dir: str, data: bytes) -> str:
    """config.json's bytes, kept by their sha256 so a switch can put them back exactly."""
    digest = hashlib.sha256(data).hexdigest()
    path = os.path.join(_ensure_dir(state_dir), f"config-{digest}.json")
    if not os.path.exists(path):
        _write(path, data, max_bytes=statefiles.KEPT_CONFIG)
    return digest


def kept_config(state_dir: str, digest: str) -> bytes | None:
    try:
        path = os.path.join(profile_dir(state_dir), f"config-{digest}.json")
        got = statefiles.read_record(path, statefiles.KEPT_CONFIG)
    except OSError:
        return None
    return got[0] if got is not None and hashlib.sha256(got[0]).hexdigest() == digest else None


# --- the hold --------------------------------------------------------------------------------


class Hold(Record):
    """Applies keep generation `generation` while the spec's content is `from_spec`.

    kind "rollback" (`reconcile rollback`): every apply holds; "failed" (an automatic rollback):
    scheduled applies hold, `reconcile apply` retries the spec that failed."""

    generation: int
    kind: str
    since: float
    by: str
    from_spec: str  # the sha256 of the spec content rolled back from
    reason: str

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(self.since))
        what = "rollback" if self.kind == "rollback" else "automatic rollback"
        return f"held at generation {self.generation} by {what} since {when}, by {self.by}: {self.reason}"

    def as_data(self) -> dict[str, Any]:
        return dict(self._asdict())


def read_hold(state_dir: str) -> Hold | None:
    data = read_index(state_dir).get("hold")  # its shape checked by statefiles.PROFILE_INDEX
    if data is None:
        return None
    return Hold(
        data["generation"], data["kind"], float(data["since"]), data["by"], data["from_spec"], data["reason"]
    )


def write_hold(state_dir: str, hold: Hold) -> None:
    index = read_index(state_dir)
    index["hold"] = hold.as_data()
    _write_index(state_dir, index)


def release_hold(state_dir: str) -> Hold | None:
    held = read_hold(state_dir)
    if held is not None:
        index = read_index(state_dir)
        index.pop("hold", None)
        _write_index(state_dir, index)
    return held
