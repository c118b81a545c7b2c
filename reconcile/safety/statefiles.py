"""The one reader of every state file reconcile keeps (under `[machine] state_dir`, and the pidfile):
opened non-blocking, never through a link, a regular file only, size-bounded, its shape checked; a
damaged one is moved aside as `<name>.corrupt-<UTC time>`, said in one line, and the run goes on.

Called by the modules that own each file (unattended.report/pause/metrics, plan.conditions,
apply.lock/journal/generations, ownership.membership, probes.server, identity, liveness); the commands
print the lines (take_notes). No other module opens or parses a state file.
"""

from __future__ import annotations

import errno
import os
import stat
import time

from reconcile.errors import ReconcileError
from reconcile.safety.shapes import (
    BOOL,
    COMMIT,
    COUNT,
    INT,
    NUM,
    OPT_INT,
    OPT_NUM,
    OPT_STR,
    OPT_TIME,
    PID,
    SIZE,
    STR,
    TIME,
    Const,
    ListOf,
    MapOf,
    Obj,
    Shape,
)
from reconcile.safety.untrusted import kind, load_json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

KiB, MiB = 1 << 10, 1 << 20
_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
AFRESH = "starting afresh"

_NOTES: list[str] = []  # one line per file moved aside, for the run's output


class NotAFile(ReconcileError):
    """What is at a state file's name is not a regular file reconcile could have written."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path} {why}")
        self.path, self.why = path, why


def note(line: str) -> None:
    """One line for the run's output about a state file (shown once, by take_notes)."""
    _NOTES.append(line)


def take_notes() -> list[str]:
    """The lines of the files moved aside since the last call (the CLI shows each once)."""
    out = list(_NOTES)
    _NOTES.clear()
    return out


def _what(mode: int) -> str:
    return f"was {kind(mode)}"


def _parent(path: str) -> tuple[int, str]:
    """An fd of `path`'s directory and the name in it: the checks, the read and the rename all act
    on that one directory, whatever happens to the way to it meanwhile."""
    directory, name = os.path.split(os.path.abspath(path))
    return os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), name


def _read(path: str, max_bytes: int) -> tuple[bytes, os.stat_result] | None:
    try:
        dfd, name = _parent(path)
    except (FileNotFoundError, NotADirectoryError):  # no state dir (yet), or a file there: none kept
        return None
    try:
        try:  # look before opening: a device node is never opened, a FIFO not even non-blocking
            seen = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(seen.st_mode):
            raise NotAFile(path, _what(seen.st_mode))
        try:
            fd = os.open(name, _READ, dir_fd=dfd)
        except FileNotFoundError:
            return None
        except OSError as exc:  # swapped since we looked
            if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
                raise NotAFile(path, "was not a regular file") from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise NotAFile(path, _what(st.st_mode))
            too_big = NotAFile(path, f"was larger than the {_size(max_bytes)} it can be")
            if st.st_size > max_bytes:
                raise too_big
            chunks: list[bytes] = []
            left = max_bytes + 1
            while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
                chunks.append(chunk)
                left -= len(chunk)
            if left <= 0:  # grew past the bound while we read
                raise too_big
            return b"".join(chunks), st
        finally:
            os.close(fd)
    finally:
        os.close(dfd)


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB else f"{n // KiB} KiB" if n >= KiB else f"{n} bytes"


def read_state(path: str, *, max_bytes: int) -> bytes | None:
    """The bytes of state file `path`, or None when it is absent. Opened O_NONBLOCK|O_NOFOLLOW (a FIFO
    cannot hang the run, a symlink is not followed), fstat'ed: anything but a regular file of at most
    `max_bytes` raises NotAFile (its `why` says what was there)."""
    got = _read(path, max_bytes)
    return None if got is None else got[0]


def read_state_stat(path: str, *, max_bytes: int) -> tuple[bytes, os.stat_result] | None:
    """read_state, with the fstat of the file read (its owner and mode, for a record's vouching)."""
    return _read(path, max_bytes)


def move_aside_corrupt(path: str, why: str, *, then: str = AFRESH) -> str:
    """Rename what is at `path` (a file, a FIFO, a directory, a symlink: never followed) to
    `<path>.corrupt-<UTC time>`, say so in one line (`take_notes`), and return the new path."""
    dfd, name = _parent(path)
    try:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        aside, n = f"{name}.corrupt-{stamp}", 1
        while _exists(aside, dfd):
            n += 1
            aside = f"{name}.corrupt-{stamp}.{n}"
        os.rename(name, aside, src_dir_fd=dfd, dst_dir_fd=dfd)
        os.fsync(dfd)
    finally:
        os.close(dfd)
    moved = os.path.join(os.path.dirname(os.path.abspath(path)), aside)
    _NOTES.append(f"state: {path} {why}: moved aside to {moved}; {then}")
    return moved


def _exists(name: str, dfd: int) -> bool:
    try:
        os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _lstat(path: str) -> os.stat_result | None:
    """What is at `path` itself (a link not followed), looked up in its directory's fd; None when it or
    its directory is absent (the writer makes them, or says why not)."""
    try:
        dfd, name = _parent(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    finally:
        os.close(dfd)


def clear_non_file(path: str, *, then: str = AFRESH) -> str | None:
    """Move aside whatever non-regular thing is at `path` (a FIFO, a directory, a symlink), before a
    writer that opens the name itself (the lock) or renames over it; returns where it went."""
    seen = _lstat(path)
    if seen is None or stat.S_ISREG(seen.st_mode):
        return None
    return move_aside_corrupt(path, _what(seen.st_mode), then=then)


def clear_non_dir(path: str, *, then: str = AFRESH) -> str | None:
    """Move aside whatever is at `path` where a state directory of reconcile's belongs (a deployment's
    <state_dir>/deployments/<name>/) and is not a real directory: a file, a FIFO, a symlink (renamed
    itself, never followed, wherever it points). Returns where it went; None when it is a directory or
    absent (its writer makes it)."""
    seen = _lstat(path)
    if seen is None or stat.S_ISDIR(seen.st_mode):
        return None
    return _aside(path, f"{_what(seen.st_mode)}, not a directory", then)


# What a writer of one of reconcile's state directories (profile/, generations/, bench/, a machine's
# profile/) calls before making it: `clear_non_dir(path, then=NEW_DIR)`. Before this, a file, FIFO or
# symlink at such a name made every later apply fail to record its generation, for good.
NEW_DIR = "a new directory is made"


def read_json(path: str, shape: Shape, *, max_bytes: int, then: str = AFRESH) -> tuple[Any, str | None]:
    """(the document, None) when `path` holds JSON of `shape`; (None, None) when absent; else it is moved
    aside and (None, where it went)."""
    try:
        raw = read_state(path, max_bytes=max_bytes)
    except NotAFile as exc:
        return None, _aside(path, exc.why, then)
    except OSError as exc:  # EIO from a failing disk, say
        return None, _aside(path, f"could not be read ({exc.strerror})", then)
    if raw is None:
        return None, None
    try:
        data = load_json(raw)
    except ValueError:  # UnicodeDecodeError included
        return None, _aside(path, "was not JSON", then)
    problem = shape.problem(data, "")
    if problem is not None:
        return None, _aside(path, f"was not what reconcile writes ({problem})", then)
    return data, None


def read_json_stat(
    path: str, shape: Shape, *, max_bytes: int, then: str = AFRESH
) -> tuple[Any, os.stat_result] | None:
    """read_json, with the fstat of the file read (its mtime, for a cache's age); None when absent or
    damaged (moved aside)."""
    try:
        got = read_state_stat(path, max_bytes=max_bytes)
    except NotAFile as exc:
        _aside(path, exc.why, then)
        return None
    except OSError as exc:
        _aside(path, f"could not be read ({exc.strerror})", then)
        return None
    if got is None:
        return None
    raw, st = got
    try:
        data = load_json(raw)
    except ValueError:
        _aside(path, "was not JSON", then)
        return None
    problem = shape.problem(data, "")
    if problem is not None:
        _aside(path, f"was not what reconcile writes ({problem})", then)
        return None
    return data, st


def _aside(path: str, why: str, then: str) -> str | None:
    """move_aside_corrupt, or (a read-only or failing disk) the line alone: the run goes on either way."""
    try:
        return move_aside_corrupt(path, why, then=then)
    except OSError as exc:
        _NOTES.append(f"state: {path} {why}: could not move it aside ({exc.strerror}); it is not used")
        return None


# --- each state file's shape ----------------------------------------------------------------------

LAST_RUN_FORMAT = "reconcile-last-run/1"
LAST_RUN = Obj(
    {
        "format": Const(LAST_RUN_FORMAT),
        "counters": Obj({"changes_total": MapOf(COUNT), "runs_total": MapOf(COUNT)}, nullable=True),
        "last_success_timestamp": OPT_TIME,
        "timestamp": OPT_TIME,
        "exit_code": OPT_INT,
        "phases": MapOf(NUM, nullable=True),  # each phase of the run and its seconds
    },
    required=("format",),
)

CONDITIONS = MapOf(Obj({"status": STR, "since": TIME}, required=("status", "since")))

PAUSE = Obj(
    {
        "reason": STR,
        "user": STR,
        "pid": PID,
        "since": TIME,
        "until": OPT_TIME,
        "tty": OPT_STR,
        "ssh_client": OPT_STR,
    },
    required=("reason", "user", "pid", "since"),
)

LOCK_HOLDER = Obj({"pid": PID, "started": TIME, "command": STR}, required=("pid", "started", "command"))

GENERATIONS_INDEX = Obj({"format": STR, "records": MapOf(STR)}, required=("records",))

GENERATION_RECORD = Obj(
    {
        "changes": ListOf(Obj({})),
        "spec_resolved": Obj({}),
        "spec_text": STR,
        "resolved": Obj({}),
        "generation": INT,
        "phases": MapOf(NUM),  # each phase of the apply or rollback and its seconds
    }
)

HOLD = Obj(
    {"generation": INT, "kind": STR, "since": TIME, "by": STR, "from_spec": STR, "reason": STR},
    required=("generation", "kind", "since", "by", "from_spec", "reason"),
)
PROFILE_INDEX = Obj(
    {
        "records": MapOf(STR),
        "current": OPT_INT,
        "hold": Obj(HOLD.fields, required=HOLD.required, nullable=True),
    },
    required=("records",),
)

PROFILE_RECORD = Obj(
    {
        "generation": INT,
        "key": STR,
        "created": TIME,
        "reason": STR,
        "verdict": Obj({"good": BOOL, "why": STR, "at": TIME}, nullable=True),
        "spec": Obj({}),
        "spec_path": OPT_STR,
        "venv": Obj({"path": OPT_STR, "packages": MapOf(STR)}, nullable=True),
        "config_json": OPT_STR,
        "launch": Obj(
            {"argv": ListOf(STR), "env": MapOf(STR), "identity": STR, "colors": MapOf(STR)}, nullable=True
        ),
        "model_commit": OPT_STR,
    },
    required=("generation", "key"),
)

MACHINE_INDEX = Obj({"records": MapOf(STR), "current": OPT_INT}, required=("records",))
MACHINE_RECORD = Obj(
    {
        "generation": INT,
        "created": TIME,
        "reason": STR,
        "deployments": MapOf(COUNT),
        "changed": ListOf(STR),
    },
    required=("generation", "created", "reason", "deployments", "changed"),
)

_PROC = Obj({"pid": INT, "start": INT, "boot": STR})
SERVER_RECORD = Obj(
    {
        "name": STR,
        "identity": OPT_STR,
        "components": MapOf(STR),
        "pid": OPT_INT,
        "launch": Obj(_PROC.fields, nullable=True),
        "members": ListOf(_PROC),
        "log_offset": SIZE,  # an offset in [server] log: past off_t, the wait's seek raised (twelfth round)
        "history": ListOf(
            Obj(
                {
                    "at": TIME,
                    "pid": PID,
                    "identity": STR,
                    "outcome": STR,
                    "reason": STR,
                    "start": INT,
                    "boot": STR,
                    "fallback": OPT_STR,
                }
            )
        ),
    }
)

LIVENESS_FORMAT = "reconcile-liveness/1"
LIVENESS = Obj(
    {
        "format": Const(LIVENESS_FORMAT),
        "stall": Obj(
            {
                "pid": PID,
                "start": NUM,
                "since": TIME,
                "tokens": OPT_NUM,
                "running": OPT_NUM,
                "waiting": OPT_NUM,
            },
            required=("pid", "start", "since"),
            nullable=True,
        ),
    },
    required=("format",),
)

# A store realization's .reconcile-realization.json: a venv's packages and inputs (reconcile.apply.store),
# a model's snapshot and files (reconcile.apply.model_store, read there through its own bound).
REALIZATION = Obj({"format": STR, "packages": MapOf(STR)}, required=("format",))

# How large each can be: generous for what reconcile writes, small against a disk error's garbage.
SMALL, RECORD = 1 * MiB, 16 * MiB
PAUSE_MAX = 64 * KiB  # paused.json
# A generation's kept config.json (profile/config-<sha256>.json): as large as the model dir's config.json
# is read (untrusted.JSON_LIMIT), so every config a generation launched with can be kept and read back.
KEPT_CONFIG = 64 * MiB


def read_last_run(path: str) -> dict[str, Any] | None:
    """last-run.json, or None (absent, or damaged: moved aside, counters start afresh)."""
    data, _ = read_json(path, LAST_RUN, max_bytes=RECORD, then="its counters start afresh")
    return data  # type: ignore[no-any-return]


def read_conditions(path: str) -> dict[str, dict[str, Any]]:
    """conditions.json: resource -> {"status", "since"}; {} when absent or damaged (moved aside)."""
    data, _ = read_json(path, CONDITIONS, max_bytes=SMALL, then="every condition starts now")
    return data or {}


def read_pause(path: str) -> tuple[dict[str, Any] | None, str | None]:
    """paused.json: (the pause, None), (None, None) when absent, (None, where it went) when damaged."""
    data, aside = read_json(path, PAUSE, max_bytes=PAUSE_MAX, then="scheduled applies stay paused")
    if data is None and aside is None and os.path.lexists(path):  # damaged, and could not be moved
        return None, path
    return data, aside


def parse_lock_holder(raw: bytes) -> dict[str, Any] | None:
    """The holder an apply wrote into apply.lock; None when empty or not one (the lock is the flock,
    not this text: a regular apply.lock is never moved aside, a live apply may hold it)."""
    try:
        data = load_json(raw)
    except ValueError:
        return None
    return data if LOCK_HOLDER.problem(data, "") is None else None


def read_generations_index(path: str) -> dict[int, str] | None:
    """generations/index.json: number -> sha256; None when there is none yet; {} when it was damaged
    (moved aside: the records it vouched for are no longer verified, and none is adopted)."""
    then = "a new index starts: the records before it are no longer verified"
    data, aside = read_json(path, GENERATIONS_INDEX, max_bytes=RECORD, then=then)
    if aside is not None:
        return {}
    if data is None:
        return None
    try:
        return {int(k): v for k, v in data["records"].items()}
    except ValueError:
        move_aside_corrupt(
            path, "was not what reconcile writes (a record number that is not a number)", then=then
        )
        return {}


def read_record(path: str, max_bytes: int = RECORD) -> tuple[bytes, os.stat_result] | None:
    """A generation record's (or, up to KEPT_CONFIG, a kept config's) bytes and fstat, for the caller
    to verify against its index; None when absent, or when something else is there (moved aside)."""
    try:
        return read_state_stat(path, max_bytes=max_bytes)
    except NotAFile as exc:
        move_aside_corrupt(path, exc.why, then="it is not used")
        return None


def unreadable(raw: bytes, *, max_bytes: int, shape: Shape | None = None) -> str | None:
    """Why the reader of a state file would move `raw` aside (None: it reads it back as written). A
    writer whose document holds a value from outside (a model's config.json, a hub's answer, a server's
    figure) checks with it first: reconcile never writes a file its own reader then discards (a kept
    config.json of 17 MiB was written, then moved aside by its 16 MiB reader: that generation's config
    lost)."""
    if len(raw) > max_bytes:
        return f"would be {_size(len(raw))}, larger than the {_size(max_bytes)} its reader takes"
    if shape is None:
        return None
    try:
        data = load_json(raw)
    except ValueError as exc:
        return f"would not be JSON its reader takes ({exc})"
    return shape.problem(data, "")


def record_problem(data: object, shape: Shape) -> str | None:
    """What is wrong with a verified record's shape (None: nothing): history lists it as skipped."""
    return shape.problem(data, "")


def read_profile_index(path: str) -> dict[str, Any]:
    """profile/index.json; a damaged one is moved aside and reads as empty (its records then fail
    verification and are skipped; no hold, no current generation)."""
    then = "a new index starts: the generations before it are no longer verified"
    data, _ = read_json(path, PROFILE_INDEX, max_bytes=RECORD, then=then)
    return data if data is not None else {"records": {}}


def read_machine_index(path: str) -> dict[str, Any]:
    """machine-profile/index.json (the machine's generations); a damaged one is moved aside and reads
    as empty (its records then fail verification and are skipped)."""
    then = "a new index starts: the machine generations before it are no longer verified"
    data, _ = read_json(path, MACHINE_INDEX, max_bytes=RECORD, then=then)
    return data if data is not None else {"records": {}}


def read_server_record(path: str) -> dict[str, Any] | None:
    """server-<name>.json; None when absent or damaged (moved aside: no launch is proven by it, the
    cgroup still is; the next start or adoption writes a new one)."""
    then = "the next start or adoption writes a new one"
    data, _ = read_json(path, SERVER_RECORD, max_bytes=RECORD, then=then)
    return data  # type: ignore[no-any-return]


def read_liveness(path: str) -> dict[str, Any] | None:
    """liveness-<name>.json: the engine stall kept across applies (reconcile.liveness); None when absent
    or damaged (moved aside: the stall is timed afresh from the next look)."""
    data, _ = read_json(path, LIVENESS, max_bytes=64 * KiB, then="the stall is timed afresh")
    return data  # type: ignore[no-any-return]


def read_pidfile(path: str) -> bytes | None:
    """The pidfile's bytes (its text is judged by ownership.membership); None when absent or when it
    is not a regular file (moved aside)."""
    try:
        return read_state(path, max_bytes=4 * KiB)
    except NotAFile as exc:
        move_aside_corrupt(path, exc.why, then="the next start writes a new one")
        return None


def read_textfile(path: str) -> str | None:
    """The Prometheus textfile a previous run wrote (its counters, when no last-run.json is known)."""
    try:
        raw = read_state(path, max_bytes=SMALL)
    except NotAFile as exc:
        move_aside_corrupt(path, exc.why, then="its counters start afresh")
        return None
    return None if raw is None else raw.decode("utf-8", errors="replace")


BENCH_FORMAT = "reconcile-bench/1"
_FIGURES = Obj(
    {"prompt": NUM, "gen": NUM, "ttft_s": NUM, "total_s": NUM, "decode_tok_s": NUM, "aggregate_tok_s": NUM},
    required=("ttft_s", "total_s", "decode_tok_s"),
)
BENCH_RUN = Obj(
    {
        "generation": OPT_INT,
        "at": NUM,
        "machine": Obj({"gpu": OPT_STR, "gpus": INT, "driver": OPT_STR, "vllm": OPT_STR}),
        "rows": ListOf(
            Obj(
                {
                    "name": STR,
                    "prompt": INT,
                    "gen": INT,
                    "concurrency": INT,
                    "requests": INT,
                    "figures": _FIGURES,
                },
                required=("name", "figures"),
            )
        ),
    },
    required=("at", "rows"),
)
BENCH = Obj({"format": Const(BENCH_FORMAT), "runs": ListOf(BENCH_RUN)}, required=("format", "runs"))


def read_bench(path: str) -> list[dict[str, Any]]:
    """bench/results.json's runs, oldest first; [] when absent or damaged (moved aside)."""
    data, _ = read_json(path, BENCH, max_bytes=RECORD, then="the figures start afresh")
    return list(data["runs"]) if data is not None else []


# The hub's listing of a model revision, cached by probes.hub under <state_dir>/cache/hub/: its file
# sizes (a large repo lists thousands of files), and the note of a failed call (one line).
HUB_LISTING = Obj(
    {"repo": STR, "revision": STR, "commit": COMMIT, "sizes": MapOf(SIZE)}, required=("commit", "sizes")
)
HUB_NOTE_MAX = 4 * KiB
HUB_LISTING_MAX = 16 * MiB


def read_hub_listing(path: str) -> tuple[dict[str, Any], float] | None:
    """A cached hub listing and its mtime; None when absent or damaged (a FIFO, a directory, a link,
    too large, not its shape: moved aside, and the hub is asked again)."""
    got = read_json_stat(path, HUB_LISTING, max_bytes=HUB_LISTING_MAX, then="the hub is asked again")
    return None if got is None else (got[0], got[1].st_mtime)


def read_hub_note(path: str) -> tuple[str, float] | None:
    """The note of a failed hub listing (why it failed) and its mtime; None when absent or damaged
    (moved aside: the hub is asked again)."""
    try:
        got = read_state_stat(path, max_bytes=HUB_NOTE_MAX)
    except NotAFile as exc:
        _aside(path, exc.why, "the hub is asked again")
        return None
    except OSError as exc:
        _aside(path, f"could not be read ({exc.strerror})", "the hub is asked again")
        return None
    return None if got is None else (got[0].decode(errors="replace"), got[1].st_mtime)
