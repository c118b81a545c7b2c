"""Maps a Change to the action that makes it true. Called only by the executor.

Actions decide nothing: the Change (re-planned right before this call) says what to do, and the
spec section says how. Imports of actions are local: a plan never loads them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from reconcile.errors import ActionError
from reconcile.loaded import LoadedSpec
from reconcile.plan import ActionResult, Change

Progress = Callable[[str], None]


def perform(loaded: LoadedSpec, change: Change, progress: Progress) -> ActionResult:
    spec = loaded.spec
    resource = change.resource
    if resource == "apt.repositories":
        from actions import apt

        assert spec.apt is not None
        results = [
            apt.add_repository(r, spec.apt.sources_dir)
            for r in spec.apt.repositories
            if r.name in change.params["repositories"]
        ]
        return ActionResult(any(r.changed for r in results), "; ".join(r.message for r in results))
    if resource == "apt":
        from actions import apt

        packages = list(change.params["packages"])
        names = [p.partition("=")[0] for p in packages]
        known = apt.apt_knows(names)
        # `apt-get update` only when a source was just added or apt does not know a package.
        return apt.install(packages, update=not all(known.values()))
    if resource == "cuda.home":
        from actions import cuda

        return cuda.point_home(str(change.params["home"]), str(change.params["target"]))
    if resource == "venv":
        from actions import venv

        assert spec.venv is not None
        return venv.create(spec.venv)
    if resource == "venv.packages":
        from actions import venv

        assert spec.venv is not None
        return venv.install(spec.venv, dict(change.params["packages"]))
    if resource == "model.files":
        from actions import model

        assert spec.model is not None
        return model.download(spec.model, progress=sys.stderr.isatty())
    if resource == "model.config":
        from actions import model_config

        assert spec.model is not None
        return model_config.patch_config(spec.model.dir, spec.model.config)
    if resource == "api_key":
        from actions import files

        assert spec.api_key is not None
        return files.ensure_key(spec.api_key)
    if resource == "server":
        from reconcile.planning_server import perform_server

        return perform_server(loaded, change, progress)
    raise ActionError(
        f"no action for resource {resource!r} (a bug: the planner made a Change nothing can apply)"
    )
