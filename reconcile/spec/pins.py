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
from reconcile.safety.names import LOCKED
from reconcile.safety.shapes import is_commit
from reconcile.safety.untrusted import load_json
from reconcile.spec.provenance import read_confined, read_trusted

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from reconcile.spec.loaded import LoadedSpec
    from reconcile.spec.models import Spec, Venv

FORMAT = "reconcile-lock/2"  # 2: the closure; 1 (pins only) is still read
OLD_FORMATS = ("reconcile-lock/1",)


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
    return m is not None and m.repo is not None and not m.offline and not is_commit(m.revision)


def read_lock(path: str, within: str | None = None) -> dict[str, Any] | None:
    """The lock's document; None when there is none. A damaged lock is an error naming its line,
    never ignored. It decides what root installs: read as the spec is (reconcile.spec.provenance),
    only when root or we alone can change it; `within` a repository that `validate` checks, only
    inside it."""
    if within is None:
        raw = read_trusted(path, path, missing_ok=True)
    else:
        raw = read_confined(path, path, within, missing_ok=True)
    if raw is None:
        return None
    fix = "run `reconcile lock` to write it again"
    try:
        text = raw.decode("utf-8")
        data = load_json(text)
    except ValueError as exc:  # UnicodeDecodeError too
        line = getattr(exc, "lineno", None)
        raise ReconcileError(
            f"{path}{f':{line}' if line else ''}: not a lock file ({getattr(exc, 'msg', exc)}); {fix}"
        ) from None
    if not isinstance(data, dict) or data.get("format") not in (FORMAT, *OLD_FORMATS):
        raise ReconcileError(f"{path}: not a {FORMAT} lock file; {fix}")
    if (problem := _lock_problem(data)) is not None:
        # every field its readers (_usable, lock_notes, used_pins) take as it is, checked once here
        key = problem.split('"')[1].split(".")[0].split("[")[0] if '"' in problem else "format"
        raise ReconcileError(f"{path}:{_line_of(text, json.dumps(key))}: {problem}; {fix}")
    closure = data.get("closure")
    if closure is not None:
        lines = closure.get("requirements") if isinstance(closure, dict) else None
        made_for = closure.get("for") if isinstance(closure, dict) else None
        asked = made_for.get("packages") if isinstance(made_for, dict) else None
        if (
            not isinstance(lines, list)
            or not isinstance(asked, dict)
            or not all(isinstance(v, str) for v in asked.values())
            or not all(isinstance(closure.get(k, ""), str) for k in ("python", "platform"))
        ):
            line = _line_of(text, '"closure"')
            raise ReconcileError(f"{path}:{line}: a damaged closure; {fix}")
        for entry in lines:
            if not isinstance(entry, str) or not re.fullmatch(LOCKED, entry):
                raise ReconcileError(
                    f"{path}:{_line_of(text, json.dumps(entry)[:60])}: {json.dumps(entry)[:80]} is not "
                    f"a locked distribution (name==version --hash=sha256:<64 hex>); {fix}"
                )
    return data


def _lock_problem(doc: dict[str, Any]) -> str | None:
    """What is wrong with the lock's pins (its closure is checked line by line above), or None:
    every field _usable, lock_notes and used_pins take as it is. A version becomes part of a
    requirement root installs, a commit the model's revision: each must be one, not any string."""
    from reconcile.safety.shapes import COMMIT, STR, MapOf, Matching, Obj

    version = Matching(LOCKED.split("==(", 1)[1].split(")", 1)[0], "a version (digits, letters, . + ! _ -)")
    shape = Obj(
        {
            "packages": MapOf(
                Obj({"specifier": STR, "version": version}, required=("specifier", "version")), nullable=True
            ),
            "model": Obj(
                {"repo": STR, "revision": STR, "commit": COMMIT},
                required=("repo", "revision", "commit"),
                nullable=True,
            ),
        }
    )
    return shape.problem({k: v for k, v in doc.items() if k in ("packages", "model")}, "")


def _line_of(text: str, needle: str) -> int:
    """The 1-based line of `needle`'s first occurrence in `text` (1 when it is not there)."""
    at = text.find(needle)
    return text.count("\n", 0, at) + 1 if at >= 0 else 1


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


def closure_request(venv: Venv) -> dict[str, Any]:
    """What a closure is resolved for: the spec's packages as written, and whether dependencies count."""
    return {"packages": dict(sorted(venv.packages.items())), "no_deps": venv.no_deps}


def python_of(command: str) -> str | None:
    """major.minor of interpreter `command` from its real file name (python3 -> python3.11), without
    running it: plan reads this on every run. None when the name does not say."""
    import shutil

    found = command if os.path.isabs(command) else shutil.which(command)
    m = re.search(r"python(\d+\.\d+)\Z", os.path.basename(os.path.realpath(found))) if found else None
    return m.group(1) if m else None


def machine_platform() -> str:
    """The platform a closure is locked for, as the target's `sysconfig.get_platform()` says it."""
    return f"{os.uname().sysname.lower()}-{os.uname().machine}"


def closure_misfit(lock: dict[str, Any], spec: Spec) -> str | None:
    """Why the lock's closure cannot be installed for `spec` here (None: it fits, or the spec has no
    packages). Works on the spec before or after `apply_lock_pins`."""
    venv = spec.venv
    if venv is None or not venv.packages:
        return None
    closure = lock.get("closure")
    if closure is None:
        return "it pins no dependency closure (a reconcile-lock/1 file)"
    made_for = closure["for"]
    wanted = made_for.get("packages") or {}
    pinned = {n: f"=={e.get('version')}" for n, e in (lock.get("packages") or {}).items()}
    differ = [
        f"{n} is {venv.packages.get(n) or 'gone'}"
        + (f" (closure made for {wanted[n]})" if n in wanted else " (not in the closure)")
        for n in sorted(set(wanted) | set(venv.packages))
        if n not in wanted or venv.packages.get(n) not in (wanted[n], pinned.get(n))
    ]
    if differ:
        return "; ".join(differ)
    if bool(made_for.get("no_deps")) != venv.no_deps:
        return f"[venv].no_deps is {str(venv.no_deps).lower()} (closure made for the other)"
    here, there = python_of(venv.python), closure.get("python")
    if here and there and here != there:
        return f"its closure is for Python {there}, [venv].python here is Python {here}"
    if closure.get("platform") and closure["platform"] != machine_platform():
        return f"its closure is for {closure['platform']}, this machine is {machine_platform()}"
    return None


def apply_lock_pins(loaded: LoadedSpec, within: str | None = None) -> LoadedSpec:
    """The spec with the lock's pins as its desired state: `vllm = ">=0.26"` becomes "==0.26.1", the
    model's `revision = "main"` its commit. Entries made for another specifier are left floating.
    `within`: the repository `validate` checks (read_lock)."""
    if (loaded.resolved.get("venv") or {}).get("closure"):
        raise ReconcileError(
            f"{loaded.files[0] if loaded.files else loaded.path}: [venv].closure is written by "
            f"`reconcile lock` into {os.path.basename(lock_path(loaded))}, not in a spec: remove it"
        )
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
    closure = lock.get("closure")
    if closure is not None and spec.venv is not None and closure_misfit(lock, spec) is None:
        venv = update.get("venv", spec.venv)
        update["venv"] = venv.model_copy(update={"closure": list(closure["requirements"])})
        resolved.setdefault("venv", {})["closure"] = list(closure["requirements"])
    if commit is not None and spec.model is not None:
        update["model"] = spec.model.model_copy(update={"revision": commit})
        resolved.setdefault("model", {})["revision"] = commit
    if not update:
        return loaded
    return loaded._replace(
        spec=spec.model_copy(update=update), resolved=resolved, sha256=_canonical_sha(resolved)
    )


def lock_notes(loaded: LoadedSpec) -> list[str]:
    """A plan note when the lock is older than the spec: a closure made for other packages (or another
    Python or platform), entries for a specifier the spec no longer has, or floating entries it does
    not pin. Works on the spec before or after `apply_lock_pins`."""
    path = lock_path(loaded)
    try:
        lock = read_lock(path)
    except ReconcileError as exc:
        return [str(exc)]
    if lock is None:
        return []
    spec, stale = loaded.spec, []
    misfit = closure_misfit(lock, spec)
    for name, entry in (lock.get("packages") or {}).items() if misfit is None else ():
        have = spec.venv.packages.get(name) if spec.venv is not None else None
        if have not in (entry.get("specifier"), f"=={entry.get('version')}"):
            stale.append(f"{name} is {have or 'gone'} (locked for {entry.get('specifier')})")
    stale += [
        f"{name} {s} is not locked"
        for name, s in floating_packages(spec).items()
        if name not in (lock.get("packages") or {}) and misfit is None  # else the misfit names it
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
    if misfit is not None:
        stale.append(f"{misfit}: the dependency closure is not locked")
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
    closure = list(getattr(spec.venv, "closure", None) or []) if spec.venv is not None else []
    digest = hashlib.sha256("\n".join(closure).encode()).hexdigest() if closure else None
    return {
        "file": path,
        "packages": packages,
        "model_commit": commit,
        "closure": {"distributions": len(closure), "sha256": digest} if closure else None,
    }
