"""The start rule: what the switch would need and is not there, found by `plan` so that `apply` refuses
before it stops the server that serves: an `[server] executable` that does not exist or is not
executable, a local `[model] source` that is not there, a venv that must be built from a wheelhouse that
is gone. Called by reconcile.preflight.gather for every spec (reads the paths now: never remembered).
"""

from __future__ import annotations

import os

from reconcile.plan.records import Finding

TYPE_CHECKING = False
if TYPE_CHECKING:
    from reconcile.spec.models import Spec


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _executable_problem(spec: Spec) -> Finding | None:
    server, venv = spec.server, spec.venv
    if server is None or server.executable is None or not server.running:
        return None
    path = server.executable
    if not path.startswith("/"):
        import shutil

        if shutil.which(path) is None:
            fix = "name the program by its full path"
            return _finding("[server].executable", path, "is not found on PATH", fix)
        return None
    # The venv is not made yet: its own Change brings its programs (and, with a store, the
    # `[venv] path` link a named executable may lie under).
    unmade = venv is not None and not os.path.lexists(os.path.join(venv.path, "bin", "python"))
    if unmade and venv is not None and (_inside(path, venv.path) or getattr(venv, "store", None) is not None):
        return None
    try:
        st = os.stat(path)
    except OSError as exc:
        why = "does not exist" if not os.path.lexists(path) else f"cannot be reached ({exc.strerror})"
        return _finding("[server].executable", path, why, "fix the path (a typo?) or install the program")
    if not os.path.isfile(path):
        return _finding("[server].executable", path, "is not a file", "name the program itself")
    if not st.st_mode & 0o111:
        return _finding("[server].executable", path, "is not executable", f"chmod 755 {path}")
    return None


def _source_problem(spec: Spec) -> Finding | None:
    model = spec.model
    if model is None or not model.source or os.path.isdir(model.source):
        return None
    why = "is not a directory" if os.path.lexists(model.source) else "does not exist"
    return _finding("[model].source", model.source, why, "fix the path, or copy the model there first")


def _wheelhouse_problem(spec: Spec) -> Finding | None:
    venv = spec.venv
    if venv is None or venv.wheelhouse is None or os.path.isdir(venv.wheelhouse):
        return None
    if os.path.lexists(os.path.join(venv.path, "bin", "python")):
        return None  # made already (with a store: a sealed realization); the venv row says if it differs
    return _finding(
        "[venv].wheelhouse",
        venv.wheelhouse,
        f"does not exist, and with a wheelhouse pip uses no index: the venv {venv.path} cannot be built",
        "put the wheels back there, or drop `wheelhouse` to install from an index",
    )


def _finding(key: str, path: str, why: str, fix: str) -> Finding:
    return Finding(
        "start.missing",
        "error",
        f"{key} {path} {why}: the server could not start, so nothing is stopped",
        fix,
        {"path": path, "key": key},
    )


def start_findings(spec: Spec) -> tuple[Finding, ...]:
    """An error for each thing the server needs to start that is not there."""
    found = (_executable_problem(spec), _source_problem(spec), _wheelhouse_problem(spec))
    return tuple(f for f in found if f is not None)
