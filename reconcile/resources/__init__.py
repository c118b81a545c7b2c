"""The resource table: every resource reconcile manages, declared once, in dependency order.

A row names the resource, the probes its planner reads, what it depends on, its planner and its
action. The prober, the planner, the executor's ordering and the re-plans around each action all
read this table; nothing else knows the list of resources. Adding one: docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from reconcile.record import Record
from reconcile.resources import api_key, apt, cuda, gpu, model, server, venv

TYPE_CHECKING = False
if TYPE_CHECKING:
    from reconcile.plan.prober import Observed
    from reconcile.plan.records import ActionResult, Change, Item
    from reconcile.spec.loaded import LoadedSpec
    from reconcile.spec.models import Spec

Planner = Callable[["Spec", "Observed"], "Item | None"]
Action = Callable[["LoadedSpec", "Change", Callable[[str], None]], "ActionResult"]
Revise = Callable[["Item", "Spec", "Observed", list[str]], "Item"]


class Resource(Record):
    """One row: `depends_on(spec)` is what must be true before its action runs (a failure there
    blocks it); `identity_input` marks what the server's launch identity covers, so that a pending
    change to it restarts the server; `revise` sees those pending changes after the whole plan."""

    name: str
    probes: tuple[str, ...]
    depends_on: Callable[[Spec], tuple[str, ...]]
    plan: Planner
    perform: Action | None  # None: apply reports the drift, it never acts (GPUs, headers)
    identity_input: bool = False
    revise: Revise | None = None


def _always(*names: str) -> Callable[[Spec], tuple[str, ...]]:
    return lambda spec: names


def _apt_deps(spec: Spec) -> tuple[str, ...]:
    return ("apt.repositories",) if spec.apt is not None and spec.apt.repositories else ()


def _cuda_home_deps(spec: Spec) -> tuple[str, ...]:
    return ("apt",) if spec.apt is not None else ()


# A start waits for everything the server reads at launch.
_SERVER_DEPENDS = ("apt", "cuda.home", "venv", "venv.packages", "model.files", "model.config", "api_key")

TABLE: tuple[Resource, ...] = (
    Resource("gpu", ("gpu",), _always(), gpu.plan_gpu, None),
    Resource("apt.repositories", ("apt",), _always(), apt.plan_apt_repositories, apt.add_repositories),
    Resource("apt", ("apt",), _apt_deps, apt.plan_apt, apt.install),
    Resource("cuda.home", ("cuda",), _cuda_home_deps, cuda.plan_cuda_home, cuda.point_home),
    Resource("cuda", ("cuda",), _always("apt", "cuda.home"), cuda.plan_cuda, None),
    Resource("venv", ("venv",), _always(), venv.plan_venv, venv.create),
    Resource("venv.packages", ("venv",), _always("venv"), venv.plan_venv_packages, venv.install, True),
    Resource("model.files", ("model",), _always(), model.plan_model_files, model.download, True),
    Resource(
        "model.config", ("model",), _always("model.files"), model.plan_model_config, model.patch_config, True
    ),
    Resource("api_key", ("api_key",), _always(), api_key.plan_api_key, api_key.ensure_key),
    Resource(
        "server",
        ("server", "health", "venv", "model", "gpu"),
        _always(*_SERVER_DEPENDS),
        server.plan_server,
        server.perform,
        revise=server.restart_after,
    ),
)

BY_NAME: Mapping[str, Resource] = {r.name: r for r in TABLE}
