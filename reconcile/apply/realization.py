"""One generation as a thing to switch to: its realized state, its spec, its config.json, its venv.

Called by reconcile.apply.switching (under the apply lock): `realized_state` is what a generation
record holds, `generation_spec` turns a record back into a spec at its realization.
"""

from __future__ import annotations

import hashlib
import json
import os

from reconcile.apply import generations
from reconcile.apply.store import realize
from reconcile.errors import ReconcileError
from reconcile.safety.sensitive import redact_document, restore_document

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from reconcile.apply.changes import ApplyReport
    from reconcile.spec.loaded import LoadedSpec


def who() -> str:
    """Who holds a generation: "alice (pid 4242, /dev/pts/1, ssh from 10.0.0.5)"."""
    from reconcile.unattended.pause import who_am_i

    user, tty, ssh = who_am_i()
    where = [w for w in (tty, f"ssh from {ssh}" if ssh else None) if w]
    return f"{user} (pid {os.getpid()}{', ' + ', '.join(where) if where else ''})"


def realized_state(loaded: LoadedSpec) -> dict[str, Any]:
    """What serving depends on, as it is now: the venv (path, packages), config.json (kept by its
    hash), the launch identity (argv, env with secrets hashed) and the model commit. Behind [front]
    the server that runs is a color's (its own name, its own Unix socket: another identity), so
    `launch.colors` holds each color's identity too, and they are part of the key: a fronted spec is
    never the same generation as a front-less one with the same launch inputs, and the generation a
    live color server carries is found (reconcile.apply.switching.carries)."""
    from actions.launching import launch_command
    from reconcile.identity import COLORS, color_spec, redact_argv
    from reconcile.plan.prober import probe_some
    from reconcile.resources.server import launch_inputs

    spec = loaded.spec
    state_dir = spec.machine.state_dir
    inputs = launch_inputs(spec, probe_some(spec, ("venv", "model")))
    config = (
        generations.keep_config(state_dir, inputs.config_json) if inputs.config_json is not None else None
    )
    launch: dict[str, Any] | None = None
    if spec.server is not None:
        cmd = launch_command(spec, inputs, key_required=False)
        # The env the spec declares (our own PATH, HOME and the markers vary by caller), secrets hashed.
        shown = generations.scrub_env(dict(spec.server.env), getattr(spec.server, "secret_env", ()))
        launch = {"argv": redact_argv(cmd.argv), "env": shown, "identity": cmd.identity.digest}
        if getattr(spec, "front", None) is not None:
            launch["colors"] = {
                c: launch_command(color_spec(spec, c), inputs, key_required=False).identity.digest
                for c in COLORS
            }
    venv_path = spec.venv.path if spec.venv is not None else None
    model_dir = spec.model.dir if spec.model is not None else None
    key_parts = [venv_path, config, launch and launch["identity"], inputs.model_revision]
    if launch is not None and "colors" in launch:
        key_parts.append(launch["colors"])
    model: dict[str, Any] | None = None
    if model_dir is not None and os.path.basename(model_dir).endswith("-model"):
        from reconcile.apply.model_store import read_seal

        seal = read_seal(model_dir) or {}
        model = {"dir": model_dir, "repo_folder": seal.get("repo_folder"), "snapshot": seal.get("snapshot")}
        key_parts.append(model_dir)  # a local source edited: another realization, another generation
    return {
        "key": hashlib.sha256(json.dumps(key_parts).encode()).hexdigest()[:32],
        "spec_path": os.path.abspath(loaded.path),
        "spec_sha256": loaded.sha256,
        "spec": redact_document(loaded.resolved),
        "venv": {"path": venv_path, "packages": dict(sorted(inputs.packages.items()))},
        "config_json": config,
        "launch": launch,
        "model_commit": inputs.model_revision,
        "model": model,
    }


def generation_spec(gen: dict[str, Any], current: LoadedSpec) -> tuple[LoadedSpec, list[str]]:
    """Generation `gen`'s spec, realized at its recorded venv, and notes. The secrets it kept only as
    hashes come from the current spec (a secret rotated since is said; one the spec lacks, refused)."""
    from reconcile.spec.loader import spec_from_resolved

    try:
        doc, notes = restore_document(gen["spec"], current.resolved)
    except ValueError as exc:
        raise ReconcileError(f"generation {gen['generation']}: {exc}") from None
    loaded = spec_from_resolved(doc, "", str(gen.get("spec_path") or current.path))
    # A stored spec is not the file in git: no "uncommitted changes" note about it.
    loaded = loaded._replace(path=current.path, files=())
    loaded = _behind_shared_front(loaded, current)
    return realize(loaded, (gen.get("venv") or {}).get("path"), (gen.get("model") or {}).get("dir")), notes


def _behind_shared_front(restored: LoadedSpec, current: LoadedSpec) -> LoadedSpec:
    """A deployment's generation recorded its [front] as a one-deployment spec has it: behind the
    machine's one HAProxy, it stays there (the shared part is the machine's now, not the record's)."""
    from reconcile.spec.fronting import FrontView, shared_front

    shared, front = shared_front(current.spec), getattr(restored.spec, "front", None)
    if shared is None or front is None:
        return restored
    me = getattr(current.spec.front, "deployment", "")
    view = FrontView(front.haproxy, list(front.ports), front.blue_green, me, shared)
    return restored._replace(spec=restored.spec.model_copy(update={"front": view}))


def seal_realization(original: LoadedSpec, applied: LoadedSpec, report: ApplyReport, good: bool) -> None:
    """A converged venv becomes an immutable realization; a good one is what the profile points at."""
    from reconcile.apply.store import (
        is_realization,
        link_profile,
        realization_inputs,
        seal,
        share_files,
        spec_store,
    )
    from reconcile.resources import BY_NAME

    store = spec_store(applied.spec)
    if store is None or report.final_plan is None:
        return
    pending = {BY_NAME[c.resource].section for c in report.final_plan.changes}
    if "model" not in pending:
        _seal_model(original, applied, report, store, good)
    # The spec's own `[venv] path` as written (the loaded spec's venv is already its realization).
    venv, profile = applied.spec.venv, (original.resolved.get("venv") or {}).get("path")
    if (
        venv is None
        or not isinstance(profile, str)
        or "venv" in pending
        or not is_realization(venv.path, store)
    ):
        return
    from probes.venv import VenvObservation, read_venv

    seen = read_venv(venv.path)
    if isinstance(seen, VenvObservation) and seal(
        venv.path, {d.name: d.version for d in seen.distributions.values()}, realization_inputs(venv)
    ):
        saved = share_files(store, venv.path)
        if saved:
            report.notes.append(f"{venv.path}: {saved / 2**20:.1f} MiB shared by hard links with older ones")
    if good and profile != venv.path:
        note = link_profile(profile, venv.path)
        if note:
            report.notes.append(note)


def restore_config(applied: LoadedSpec, gen: dict[str, Any]) -> None:
    """Put the generation's config.json bytes back, atomically, before the plan sees them."""
    from reconcile.host import atomic_write

    model, digest = applied.spec.model, gen.get("config_json")
    if model is None or not digest:
        return
    from reconcile.safety.untrusted import JSON_LIMIT, NotRegular, TooLarge, read_regular

    data = generations.kept_config(applied.spec.machine.state_dir, digest)
    path = os.path.join(model.dir, "config.json")
    now: bytes | None = None
    mode = 0o644
    try:  # as data: a FIFO, a device or a link there is replaced by the kept bytes, never waited on
        now = read_regular(path, JSON_LIMIT)
        mode = os.lstat(path).st_mode & 0o777
    except (NotRegular, TooLarge):
        pass
    except OSError:
        return  # no model files yet: the model's own Changes bring them
    if data is not None and now != data:
        atomic_write(path, data, mode=mode)


def _seal_model(
    original: LoadedSpec, applied: LoadedSpec, report: ApplyReport, store: str, good: bool
) -> None:
    """A converged model realization is kept by content (model_store.seal_model); a good one is what
    `[model] dir` links to."""
    from reconcile.apply.model_store import seal_model
    from reconcile.apply.store import is_realization, link_profile

    model, profile = applied.spec.model, (original.resolved.get("model") or {}).get("dir")
    if model is None or not isinstance(profile, str) or not is_realization(model.dir, store):
        return
    shared = seal_model(store, model.dir, model)
    if shared >= 2**20 // 10:
        report.notes.append(f"{model.dir}: {shared / 2**20:.1f} MiB of model files shared with older ones")
    if good and profile != model.dir:
        note = link_profile(profile, model.dir)
        if note:
            report.notes.append(note)


def profiles_moved(original: LoadedSpec, applied: LoadedSpec) -> bool:
    """Whether `[venv] path` or `[model] dir` (links, as written) points elsewhere than the realization
    applied, or is not there at all: a switch back to realizations that are all there changes no file,
    yet it is a switch; and an apply killed after its server started but before it made the link
    leaves the next one nothing else to do (a directory there, made before the store, is left alone)."""
    pairs = (
        ((original.resolved.get("venv") or {}).get("path"), applied.spec.venv and applied.spec.venv.path),
        ((original.resolved.get("model") or {}).get("dir"), applied.spec.model and applied.spec.model.dir),
    )
    for profile, target in pairs:
        if not isinstance(profile, str) or not target or profile == target:
            continue
        if not os.path.lexists(profile) or (os.path.islink(profile) and os.readlink(profile) != target):
            return True
    return False
