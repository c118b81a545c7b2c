"""The model's config.json patch: deep-merge `[model].config` onto the original, kept as config.json.bak.

`patch_config` is the action for the `model.config` Change; `desired_config` is the pure helper it
merges with (reconcile.jsonmerge.deep_merge, which the planner and the preflight call too). Merge
rules: dicts merge recursively, any other value replaces. There is no delete: TOML has no null, so a
key leaves the patch by being dropped from it, and the backed-up original value comes back. (A Python
caller's None is written as JSON null, like any value.)
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping

from reconcile.errors import ActionError
from reconcile.host import atomic_write, fsync_dir, remove_stale_temps
from reconcile.jsonmerge import deep_merge
from reconcile.plan.records import ActionResult
from reconcile.record import Record
from reconcile.safety.untrusted import JSON_LIMIT, load_json, read_regular, reduced_mode

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

CONFIG = "config.json"
BACKUP = "config.json.bak"


def desired_config(model_dir: str, patch: Mapping[str, Any]) -> dict[str, Any]:
    """What config.json must hold: the original (the backup once one exists) with `patch` merged in."""
    return deep_merge(_load(_original_path(model_dir)), patch)


def patch_config(model_dir: str, patch: Mapping[str, Any]) -> ActionResult:
    """Make config.json = deep_merge(original, patch); back the original up once before the first write."""
    path, backup = os.path.join(model_dir, CONFIG), os.path.join(model_dir, BACKUP)
    _remove_stale_temps(model_dir)
    if not os.path.exists(path) and not os.path.exists(backup):
        raise ActionError(f"{path}: missing; the model's files must be in place before it is patched")
    original_bytes = _read(_original_path(model_dir))
    original = _parse(original_bytes, _original_path(model_dir))
    desired = deep_merge(original, patch)
    # A patch that changes nothing (empty, or equal to the original) restores the original's exact bytes.
    want = original_bytes if desired == original else render(desired, detect_style(original_bytes))
    current = _read(path) if os.path.exists(path) else None
    if current == want:
        if desired == original:
            return ActionResult(False, f"{path}: already the original (nothing to patch)")
        return ActionResult(False, f"{path}: already has the patch ({_keys(patch)})")
    mode = os.stat(_original_path(model_dir)).st_mode & 0o7777
    made_backup = False
    if not os.path.exists(backup):
        # Only config.json itself can be the original here (no backup yet): keep its bytes before touching it.
        atomic_write(backup, original_bytes, mode=mode)
        made_backup = True
    atomic_write(path, want, mode=mode)
    if desired == original:
        return ActionResult(True, f"{path}: restored the original from {BACKUP}")
    note = f"; original kept as {BACKUP}" if made_backup else ""
    return ActionResult(True, f"{path}: merged {_keys(patch)}{note}")


class JsonStyle(Record):
    """How a JSON file is laid out, so that a rewrite keeps it: indent unit, final newline, ASCII escapes."""

    indent: str | None  # None: one line
    trailing_newline: bool
    ensure_ascii: bool


def detect_style(raw: bytes) -> JsonStyle:
    text = raw.decode("utf-8", errors="replace")
    m = re.search(r"[\[{][ \t]*\r?\n([ \t]+)\S", text)
    indent = None
    if m:
        lead = m.group(1)
        indent = "\t" if lead.startswith("\t") else lead
    elif "\n" in text.strip():
        indent = ""  # newline-separated, no indentation
    return JsonStyle(indent, text.endswith("\n"), ensure_ascii=text.isascii())


def render(obj: Mapping[str, Any], style: JsonStyle) -> bytes:
    if style.indent is None:
        text = json.dumps(obj, ensure_ascii=style.ensure_ascii)
    else:
        text = json.dumps(obj, indent=style.indent, ensure_ascii=style.ensure_ascii)
    return (text + ("\n" if style.trailing_newline else "")).encode("utf-8")


def _original_path(model_dir: str) -> str:
    backup = os.path.join(model_dir, BACKUP)
    return backup if os.path.exists(backup) else os.path.join(model_dir, CONFIG)


def _read(path: str) -> bytes:
    """A JSON file of the model dir, as data: a regular file (never a FIFO's wait), within JSON_LIMIT."""
    try:
        return read_regular(path, JSON_LIMIT)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise ActionError(f"{path}: {exc.strerror}; move it aside and apply again") from None


def _load(path: str) -> dict[str, Any]:
    if not os.path.exists(path):
        raise ActionError(f"{path}: missing; the model's files must be in place before it is patched")
    return _parse(_read(path), path)


def _parse(raw: bytes, path: str) -> dict[str, Any]:
    try:
        obj = load_json(raw)
    except ValueError as exc:
        fix = "restore it from the hub (delete it and apply again)"
        raise ActionError(f"{path}: not valid JSON ({exc}); {fix}") from None
    if not isinstance(obj, dict):
        raise ActionError(f"{path}: a JSON {type(obj).__name__}, not an object; restore it from the hub")
    return obj


def _keys(patch: Mapping[str, Any]) -> str:
    return ", ".join(sorted(patch)) or "(empty patch)"


def _remove_stale_temps(model_dir: str) -> None:
    # atomic_write's temp files survive a SIGKILL: only ours, of these two files, of a writer that is gone.
    remove_stale_temps(model_dir, (CONFIG, BACKUP))


# -- config.json among the model's files (used by actions.model's download and copy) ---------------------


def original_path(model_dir: str, name: str) -> str:
    """Where a model file's pristine bytes are: config.json.bak once config.json has been patched."""
    if name == CONFIG and os.path.exists(os.path.join(model_dir, BACKUP)):
        return os.path.join(model_dir, BACKUP)
    return os.path.join(model_dir, name)


def git_blob_sha1(path: str) -> str:
    """The git object id of a file: what the hub lists as a regular file's blobId and ETag."""
    import hashlib  # SHA-1 of a whole file: only after a download, never on a converged plan

    digest = hashlib.sha1(b"blob %d\x00" % os.stat(path).st_size)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def drop_stale_backup(model_dir: str, hub_blob_id: str | None) -> None:
    """After a download: a new original config.json (written over the patched one) makes the backup stale.

    Dropping it lets the config patch back up, and merge onto, the new original.
    """
    path, backup = os.path.join(model_dir, CONFIG), os.path.join(model_dir, BACKUP)
    if hub_blob_id is None or not os.path.exists(backup) or not os.path.exists(path):
        return
    if git_blob_sha1(path) == hub_blob_id and git_blob_sha1(backup) != hub_blob_id:
        os.unlink(backup)
        fsync_dir(model_dir)


def changed_while_copied(name: str) -> str:
    """Why a source file's copy is refused: its bytes are not the ones hashed for its record."""
    return (
        f"[model].source: {name} changed while it was copied (the bytes copied are not the ones hashed): "
        "nothing recorded for it; apply again once the source is still"
    )


def place_source_config(
    src: int, st: os.stat_result, model_dir: str, digest: str | None
) -> tuple[bool, str] | None:
    """Copy mode, config.json once patched: compare the source (open as data: `src`, `st` its fstat)
    with the backup, not the patched file.

    None: not patched (copy it like any file). (False, sha256): the original is unchanged. (True,
    sha256): a new original was written and the stale backup dropped (the config patch then runs on
    the new original). The bytes read must be those hashed as `digest`, when it was.
    """
    backup = os.path.join(model_dir, BACKUP)
    if not os.path.exists(backup):
        return None
    if st.st_size > JSON_LIMIT:
        raise ActionError(f"the source's config.json is {st.st_size} bytes, more than a config holds")
    new = os.pread(src, st.st_size, 0)
    import hashlib

    held = hashlib.sha256(new).hexdigest()
    if digest is not None and held != digest:  # its owner wrote it since it was hashed
        raise ActionError(changed_while_copied("config.json"))
    if new == _read(backup):
        return False, held
    atomic_write(os.path.join(model_dir, CONFIG), new, mode=reduced_mode(st.st_mode))
    os.utime(os.path.join(model_dir, CONFIG), ns=(st.st_atime_ns, st.st_mtime_ns))
    os.unlink(backup)
    fsync_dir(model_dir)
    return True, held
