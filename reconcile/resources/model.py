"""The model's files (download or copy) and its config.json patch: plan items and actions.

Declares (at the end) the model probe (probes.model) and the model.files and model.config kinds;
actions: actions.model, actions.model_config.
"""

from __future__ import annotations

import os

from probes.common import Invalid, ProbeFailure
from reconcile.plan.records import Action, ActionResult, Change, FieldDiff, Item
from reconcile.resources.common import Kind, Probe, Progress, change, failed, giB, needs, ok

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from reconcile.resources import Observed
    from reconcile.spec.loaded import LoadedSpec
    from reconcile.spec.models import Model, Spec


def plan_model_files(spec: Spec, obs: Observed) -> Item | None:
    if spec.model is None:
        return None
    from probes.model import DownloadRecord, ModelObservation

    want = spec.model
    m = obs.model
    origin = f"{want.repo}@{want.revision}" if want.repo else (want.source or "?")
    if isinstance(m, ProbeFailure):
        return failed(m, "model")
    drift_walks = isinstance(m, ModelObservation) and isinstance(m.record, DownloadRecord)
    refused = None  # with a record, source_drift below walks the source
    if want.source and not want.repo and not drift_walks:
        have = m.files if isinstance(m, ModelObservation) else {}
        refused = _source_refusal(want.source, want.allow_patterns, want.dir, have)
    if refused is not None:
        return refused
    if not isinstance(m, ModelObservation):
        verb = "download" if want.repo else "copy"
        return change(
            Action.CREATE,
            f"{verb} {origin} into {want.dir}",
            "the model directory is absent",
            (FieldDiff("dir", None, want.dir),),
        )
    record = m.record
    diffs: list[FieldDiff] = []
    if not isinstance(record, DownloadRecord):
        diffs.append(FieldDiff("record", None, origin))
    else:
        if want.repo and (record.repo != want.repo or not _same_revision(record, want.revision)):
            had = f"{record.repo}@{record.revision} ({(record.commit or '')[:12]})"
            diffs.append(FieldDiff("revision", had, origin))
        # A patched config.json differs from the recorded size by design: judge its backup instead.
        on_disk = dict(m.files)
        if "config.json.bak" in on_disk:
            on_disk["config.json"] = on_disk["config.json.bak"]
        wrong = [f for f, size in record.files.items() if on_disk.get(f) != size]
        if wrong:
            diffs.append(
                FieldDiff(
                    "files", f"{len(wrong)} missing or wrong size ({', '.join(wrong[:3])})", "as recorded"
                )
            )
        # A sealed realization is addressed by its source's content when it was made: a source edited
        # since makes another realization (a rollback to this one must not copy the edit into it).
        if want.source and not want.repo and not m.sealed:
            if record.source != want.source:
                diffs.append(FieldDiff("source", record.source, want.source))
            from probes.model_source import source_drift  # by content: a same-size edit is drift

            try:
                drift = source_drift(want.source, on_disk, want.allow_patterns, record.source_files)
            except OSError as exc:  # NotRegular: a FIFO, a device (never opened), named
                return _refused(want.source, exc)
            if drift:
                diffs.append(FieldDiff("files", ", ".join(drift[:3]), f"as in {want.source}"))
    if diffs:
        verb = "download" if want.repo else "copy"
        return change(
            Action.CHANGE,
            f"{verb} {origin} into {want.dir}",
            "the model's files differ from the spec",
            tuple(diffs),
        )
    if m.missing_required:
        return change(
            Action.CHANGE,
            f"missing {', '.join(m.missing_required)}",
            f"{origin} does not bring these required files; add them to the model dir or fix "
            "[model].required_files",
            actionable=False,
        )
    total = sum(m.files.values())
    commit = f" ({record.commit[:12]})" if isinstance(record, DownloadRecord) and record.commit else ""
    if isinstance(record, DownloadRecord) and record.source:
        origin = record.source
    return ok(f"{want.dir}: {len(m.files)} files, {giB(total)}, from {origin}{commit}")


def _source_refusal(source: str, patterns: list[str], model_dir: str, have: Mapping[str, int]) -> Item | None:
    """What apply would refuse before the first copy, named: a source file that is not a regular file,
    or a source larger than the model dir's free space. A walk with stats, no hashing."""
    from probes.model_source import source_sizes
    from reconcile.safety.untrusted import past_free_space

    try:
        sizes = source_sizes(source, patterns)
    except OSError as exc:
        return _refused(source, exc)
    need = {name: size for name, size in sizes.items() if have.get(name) != size}
    if (problem := past_free_space(model_dir, need)) is not None:
        return change(
            Action.CHANGE,
            f"[model].source {source}: {problem}: refused",
            "free space there, or leave files out with allow_patterns",
            actionable=False,
        )
    return None


def _refused(source: str, exc: OSError) -> Change:
    from reconcile.safety.untrusted import TooMany

    name = os.path.relpath(exc.filename, source) if os.path.isabs(exc.filename or "") else exc.filename
    what = exc.strerror if name in (".", None) else f"{name} is {exc.strerror}"
    why = (
        "point [model].source at the model's own files (apply copies nothing while it holds more)"
        if isinstance(exc, TooMany)
        else "a model's files are regular files: remove it from the source (apply copies nothing while it is)"
    )
    what = (what or "").removesuffix(": refused")
    return change(Action.CHANGE, f"[model].source {source}: {what}: refused", why, actionable=False)


def _same_revision(record: Any, revision: str) -> bool:
    return bool(record.revision == revision or (record.commit and record.commit.startswith(revision)))


def plan_model_config(spec: Spec, obs: Observed) -> Item | None:
    if spec.model is None:
        return None
    from probes.model import JsonDoc, ModelObservation
    from reconcile.jsonmerge import deep_merge

    patch = spec.model.config
    m = obs.model
    if not isinstance(m, ModelObservation):
        if not patch:
            return None
        was = source_config(spec.model)  # a local source's config.json is what the copy brings
        return change(
            Action.CHANGE,
            "config.json  + " + _keys(patch),
            "patch the config once the files are in",
            tuple(FieldDiff(k, was.get(k), v) for k, v in patch.items()),
        )
    backup = m.config_backup
    if isinstance(backup, Invalid) or isinstance(m.config, Invalid):
        bad = backup if isinstance(backup, Invalid) else m.config
        assert isinstance(bad, Invalid)
        return change(
            Action.CHANGE,
            f"{bad.path}: {bad.message}",
            "fix or remove the file by hand",
            actionable=False,
        )
    if not patch and not isinstance(backup, JsonDoc):
        return None
    config_now = m.config.data if isinstance(m.config, JsonDoc) else {}
    original = backup.data if isinstance(backup, JsonDoc) else config_now
    current = m.config.data if isinstance(m.config, JsonDoc) else None
    desired = deep_merge(original, patch)
    if current == desired:
        if not patch:
            return ok("config.json is the original")
        return ok(f"config.json has {_keys(patch)}")
    diffs = _json_diffs(current or {}, desired)
    sign = Action.CREATE if all(d.old is None for d in diffs) else Action.CHANGE
    return change(
        Action.CHANGE,
        f"config.json  {sign} {', '.join(d.field for d in diffs[:3])}",
        "config.json differs from the original merged with [model].config",
        tuple(diffs),
        params={"dir": spec.model.dir},
    )


def _keys(patch: dict[str, Any]) -> str:
    return ", ".join(patch)


def _json_diffs(old: Any, new: Any) -> list[FieldDiff]:
    """Per-path old -> new, from deepdiff (imported only when there is a difference to show)."""
    from deepdiff import DeepDiff

    diff = DeepDiff(old, new, ignore_order=False, verbose_level=2)
    out: list[FieldDiff] = []

    def path(p: str) -> str:
        return p.replace("root", "", 1).replace("']['", ".").strip("[]'")

    for p, v in diff.get("dictionary_item_added", {}).items():
        out.append(FieldDiff(path(p), None, v))
    for p, v in diff.get("dictionary_item_removed", {}).items():
        out.append(FieldDiff(path(p), v, None))
    for key in ("values_changed", "type_changes"):
        for p, v in diff.get(key, {}).items():
            out.append(FieldDiff(path(p), v.get("old_value"), v.get("new_value")))
    for key in ("iterable_item_added", "iterable_item_removed"):
        for p, v in diff.get(key, {}).items():
            out.append(
                FieldDiff(
                    path(p), v if key.endswith("removed") else None, v if key.endswith("added") else None
                )
            )
    return out or [FieldDiff("config.json", old, new)]


def download(loaded: LoadedSpec, change: Change, progress: Progress) -> ActionResult:
    import sys

    from actions import model

    assert loaded.spec.model is not None
    return model.download(loaded.spec.model, progress=sys.stderr.isatty())


def patch_config(loaded: LoadedSpec, change: Change, progress: Progress) -> ActionResult:
    from actions import model_config

    assert loaded.spec.model is not None
    return model_config.patch_config(loaded.spec.model.dir, loaded.spec.model.config)


def source_config(model: Model) -> dict[str, Any]:
    """The top-level keys of `[model] source`'s config.json ({} without a local source, or unreadable)."""
    if not model.source:
        return {}

    from reconcile.safety.filesafety import UnsafePath, data_root
    from reconcile.safety.untrusted import JSON_LIMIT, load_json, read_regular

    try:  # the source is data from outside: by the data role's path; a regular file, bounded (class 2)
        source = data_root(model.source)
        data = load_json(read_regular(os.path.join(source, "config.json"), JSON_LIMIT, tree=source))
    except (OSError, ValueError, UnsafePath):
        return {}
    return data if isinstance(data, dict) else {}


PROBES = (
    Probe(
        "model",
        "probes.model",
        "model",
        tags={
            "ModelObservation": "model",
            "JsonDoc": "model.json",
            "DownloadRecord": "model.download",
            "HubListing": "hub-listing",  # the tag it had before it was listed (probes.hub: the preflight's)
        },
    ),
)
KINDS = (
    Kind("model.files", "model", ("model",), plan_model_files, download, restarts_server=True),
    Kind(
        "model.config",
        "model",
        ("model",),
        plan_model_config,
        patch_config,
        needs("model.files"),
        restarts_server=True,
    ),
)
