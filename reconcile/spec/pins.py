"""The lock file `specs/<name>.lock` (Nix's flake.lock): what floats in a spec, pinned.

`apply_lock_pins` (the CLI, right after loading a spec for plan and apply) makes the lock's pins
the desired state; the planner reads `lock_notes`, the executor `used_pins`. `reconcile.authoring.lockfile`
writes the lock.
"""

from __future__ import annotations

import hashlib
import json
import os
import re

from reconcile.errors import ReconcileError
from reconcile.safety.untrusted import load_json
from reconcile.spec.provenance import read_confined, read_trusted

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from reconcile.spec.loaded import LoadedSpec
    from reconcile.spec.models import Spec

FORMAT = "reconcile-lock/1"
_COMMIT = r"^[0-9a-f]{40}$"  # compiled on first use (by re's cache), not on import


def lock_path(loaded: LoadedSpec) -> str:
    """specs/<name>.lock beside the machine's own spec file (not its bases)."""
    return os.path.splitext(loaded.files[0] if loaded.files else os.path.abspath(loaded.path))[0] + ".lock"


def is_exact(specifier: str) -> bool:
    """`==0.26.0` (or `===x`) names one version; anything else (`>=`, `~=`, `*`, `==0.26.*`) floats."""
    parts = [p.strip() for p in specifier.split(",") if p.strip()]
    return len(parts) == 1 and (
        parts[0].startswith("===") or (parts[0].startswith("==") and "*" not in parts[0])
    )


def floating_packages(spec: Spec) -> dict[str, str]:
    if spec.venv is None:
        return {}
    return {name: s for name, s in spec.venv.packages.items() if not is_exact(s)}


def floating_model(spec: Spec) -> bool:
    m = spec.model
    return m is not None and m.repo is not None and not m.offline and not re.match(_COMMIT, m.revision)


def read_lock(path: str, within: str | None = None) -> dict[str, Any] | None:
    """The lock's document; None when there is none. A damaged lock is an error, never ignored. It
    decides versions root installs: read as the spec is (reconcile.spec.provenance), only when root
    or we alone can change it; `within` a repository that `validate` checks, only inside it."""
    if within is None:
        raw = read_trusted(path, path, missing_ok=True)
    else:
        raw = read_confined(path, path, within, missing_ok=True)
    if raw is None:
        return None
    try:
        data = load_json(raw.decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError too
        raise ReconcileError(
            f"{path}: not a lock file ({exc}); run `reconcile lock` to write it again"
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ReconcileError(f"{path}: not a {FORMAT} lock file; run `reconcile lock` to write it again")
    return data


def _canonical_sha(resolved: dict[str, Any]) -> str:
    # As reconcile.spec.loader hashes the resolved document, so a pinned spec has its own sha256.
    text = json.dumps(resolved, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _usable(lock: dict[str, Any], spec: Spec) -> tuple[dict[str, str], str | None]:
    """The pins that still fit the spec: (package -> version, model commit)."""
    pins: dict[str, str] = {}
    for name, entry in (lock.get("packages") or {}).items():
        if spec.venv is not None and spec.venv.packages.get(name) == entry.get("specifier"):
            pins[name] = str(entry["version"])
    m, want = lock.get("model") or {}, spec.model
    commit = None
    if want is not None and m and want.repo == m.get("repo") and want.revision == m.get("revision"):
        commit = str(m["commit"])
    return pins, commit


def apply_lock_pins(loaded: LoadedSpec, within: str | None = None) -> LoadedSpec:
    """The spec with the lock's pins as its desired state: `vllm = ">=0.26"` becomes "==0.26.1", the
    model's `revision = "main"` its commit. Entries made for another specifier are left floating.
    `within`: the repository `validate` checks (read_lock)."""
    lock = read_lock(lock_path(loaded), within)
    if lock is None:
        return loaded
    spec = loaded.spec
    pins, commit = _usable(lock, spec)
    import copy  # with weakref: only when a lock applies

    resolved = copy.deepcopy(loaded.resolved)
    update: dict[str, Any] = {}
    if pins and spec.venv is not None:
        packages = {**spec.venv.packages, **{n: f"=={v}" for n, v in pins.items()}}
        update["venv"] = spec.venv.model_copy(update={"packages": packages})
        resolved.setdefault("venv", {}).setdefault("packages", {}).update(
            {n: f"=={v}" for n, v in pins.items()}
        )
    if commit is not None and spec.model is not None:
        update["model"] = spec.model.model_copy(update={"revision": commit})
        resolved.setdefault("model", {})["revision"] = commit
    if not update:
        return loaded
    return loaded._replace(
        spec=spec.model_copy(update=update), resolved=resolved, sha256=_canonical_sha(resolved)
    )


def lock_notes(loaded: LoadedSpec) -> list[str]:
    """A plan note when the lock is older than the spec: entries for a specifier the spec no longer
    has, or floating entries it does not pin. Works on the spec before or after `apply_lock_pins`."""
    path = lock_path(loaded)
    try:
        lock = read_lock(path)
    except ReconcileError as exc:
        return [str(exc)]
    if lock is None:
        return []
    spec, stale = loaded.spec, []
    for name, entry in (lock.get("packages") or {}).items():
        have = spec.venv.packages.get(name) if spec.venv is not None else None
        if have not in (entry.get("specifier"), f"=={entry.get('version')}"):
            stale.append(f"{name} is {have or 'gone'} (locked for {entry.get('specifier')})")
    stale += [
        f"{name} {s} is not locked"
        for name, s in floating_packages(spec).items()
        if name not in (lock.get("packages") or {})
    ]
    m, want = lock.get("model") or {}, spec.model
    if m and (
        want is None
        or want.repo != m.get("repo")
        or want.revision not in (m.get("revision"), m.get("commit"))
    ):
        stale.append(
            f"the model is {want.repo if want else 'gone'}@{want.revision if want else ''} "
            f"(locked for {m.get('repo')}@{m.get('revision')})"
        )
    elif not m and floating_model(spec):
        stale.append("the model's revision is not locked")
    if not stale:
        return []
    return [
        f"{os.path.basename(path)} is older than the spec: {'; '.join(stale)}; those float until "
        "`reconcile lock` refreshes the lock"
    ]


def used_pins(loaded: LoadedSpec) -> dict[str, Any] | None:
    """What a generation records as resolved from the lock: the pins in force for this spec."""
    path = lock_path(loaded)
    lock = read_lock(path)
    if lock is None:
        return None
    spec = loaded.spec
    packages = {
        n: str(e["version"])
        for n, e in (lock.get("packages") or {}).items()
        if spec.venv is not None and spec.venv.packages.get(n) == f"=={e['version']}"
    }
    m = lock.get("model") or {}
    commit = (
        m.get("commit") if m and spec.model is not None and spec.model.revision == m.get("commit") else None
    )
    return {"file": path, "packages": packages, "model_commit": commit}
