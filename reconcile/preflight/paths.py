"""The path rule: every path reconcile writes (as root) or trusts must sit where no other user can
swap or plant it (reconcile.safety.filesafety's StrictModes check). Called by reconcile.preflight for
every spec, so `plan` names the path and `apply` refuses before it touches anything."""

from __future__ import annotations

import os

from reconcile.plan.records import Finding
from reconcile.safety.filesafety import FIX, owners, parent_problem
from reconcile.safety.untrusted import not_regular

TYPE_CHECKING = False  # typing itself is not imported at run time (reconcile/record.py says why)
if TYPE_CHECKING:
    from reconcile.spec.models import Spec


def watched_paths(spec: Spec) -> list[tuple[str, str, frozenset[int]]]:
    """(what, path, who may own it and its parents) for each path apply writes or trusts."""
    paths = [("[machine].state_dir", spec.machine.state_dir, owners())]
    if spec.venv is not None:
        paths.append(("[venv].path", spec.venv.path, owners()))
    if spec.model is not None:
        paths.append(("[model].dir", spec.model.dir, owners()))
    if spec.api_key is not None:
        import pwd

        try:
            extra = {pwd.getpwnam(spec.api_key.owner).pw_uid}
        except KeyError:
            extra = set()  # the api_key action says the user does not exist
        paths.append(("[api_key].file", spec.api_key.file, owners(extra)))
    server = spec.server
    if server is not None:
        paths.append(("[server].log", server.log, owners()))
        if server.pidfile is not None:
            paths.append(("[server].pidfile", server.pidfile, owners()))
        if server.executable is not None:
            paths.append(("[server].executable", server.executable, owners()))
        for name, path in sorted(server.secret_files.items()):
            paths.append((f"[server].secret_files.{name}", path, owners()))
    return paths


def symlinked_model_dir(model_dir: str) -> str | None:
    """Why a symlinked [model].dir is refused (None when it is not one): writing through the link
    would patch and overwrite the files of whatever it points at, backups and all."""
    if not os.path.islink(model_dir):
        return None
    return (
        f"[model].dir {model_dir} is a symlink (to {os.readlink(model_dir)}): reconcile writes only into a "
        f'real directory, never through a link; set [model].dir = "{os.path.realpath(model_dir)}" '
        "or replace the link with a directory"
    )


def path_findings(spec: Spec) -> tuple[Finding, ...]:
    """An error per path another user could swap, plant or make us follow (a symlinked log, a
    planted key, an executable in a directory they can write), and for a symlinked model dir."""
    out = []
    if spec.model is not None and (why := symlinked_model_dir(spec.model.dir)) is not None:
        out.append(Finding("paths.symlink", "error", why, "", {"path": spec.model.dir, "key": "[model].dir"}))
    for what, path, allowed in watched_paths(spec):
        problem = parent_problem(path, allowed)
        if problem is not None:
            out.append(
                Finding(
                    "paths.owner",
                    "error",
                    f"{what} {path}: {problem}",
                    FIX,
                    {"path": path, "key": what},
                )
            )
    for name, path in sorted(spec.server.secret_files.items()) if spec.server is not None else ():
        try:
            st = os.lstat(path)
        except OSError:
            continue  # the server Change says it cannot be read
        if (kind := not_regular(st.st_mode)) is not None:  # a FIFO would hang the read, a link lead elsewhere
            out.append(
                Finding(
                    "paths.secret-kind",
                    "error",
                    f"[server].secret_files.{name} {path} is {kind}",
                    "put the secret in a regular file there (mode 0600): reconcile reads it as data",
                    {"path": path, "key": f"[server].secret_files.{name}"},
                )
            )
            continue
        loose = st.st_mode & 0o077
        if loose:
            out.append(
                Finding(
                    "paths.secret-mode",
                    "warning",
                    f"[server].secret_files.{name} {path} is readable or writable by others "
                    f"(mode {os.stat(path).st_mode & 0o777:04o})",
                    f"chmod 600 {path}",
                    {"path": path, "key": f"[server].secret_files.{name}"},
                )
            )
    return tuple(out)
