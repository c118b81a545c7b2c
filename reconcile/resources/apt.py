"""apt repositories and packages: the plan item for each, and the action that makes it true.

Declares (at the end) the apt probe (probes.apt) and the apt.repositories and apt kinds; action:
actions.apt.
"""

from __future__ import annotations

from reconcile.plan.records import Action, ActionResult, Change, FieldDiff, Item
from reconcile.resources.common import Kind, Probe, Progress, change, failed, ok

TYPE_CHECKING = False
if TYPE_CHECKING:
    from reconcile.plan.records import ChangeKind
    from reconcile.resources import Observed
    from reconcile.spec.loaded import LoadedSpec
    from reconcile.spec.models import Spec


def _repo_file(spec: Spec, name: str) -> str:
    assert spec.apt is not None
    return f"{spec.apt.sources_dir.rstrip('/')}/reconcile-{name}.list"


def plan_apt_repositories(spec: Spec, obs: Observed) -> Item | None:
    if spec.apt is None or not spec.apt.repositories:
        return None
    if (bad := failed(obs.apt, "apt")) is not None:
        return bad
    from probes.apt import AptObservation

    assert isinstance(obs.apt, AptObservation)
    missing: list[str] = []
    for repo in spec.apt.repositories:
        path = _repo_file(spec, repo.name)
        found = [s for s in obs.apt.sources if s.file == path and s.enabled]
        good = any(
            s.uri.rstrip("/") == repo.uri.rstrip("/")
            and s.suite == repo.suite
            and tuple(s.components) == tuple(repo.components)
            and (s.trusted if repo.trusted else repo.keyring in s.signed_by)
            for s in found
        )
        if not good or (repo.keyring and not obs.apt.keyrings.get(repo.keyring, False)):
            missing.append(repo.name)
    if not missing:
        return ok(", ".join(r.name for r in spec.apt.repositories))
    return change(
        Action.CREATE,
        f"add repository {', '.join(missing)}",
        "the spec names a repository that apt does not have (or its keyring is missing)",
        tuple(FieldDiff(n, None, _repo_file(spec, n)) for n in missing),
        params={"repositories": missing},
    )


def plan_apt(spec: Spec, obs: Observed) -> Item | None:
    if spec.apt is None or not spec.apt.packages:
        return None
    if (bad := failed(obs.apt, "apt")) is not None:
        return bad
    from probes.apt import AptObservation

    assert isinstance(obs.apt, AptObservation)
    todo: list[str] = []
    diffs: list[FieldDiff] = []
    for entry in spec.apt.packages:
        name, _, pin = entry.partition("=")
        status = obs.apt.packages.get(name)
        have = status.version if status is not None and status.state == "installed" else None
        if have is None or (pin and have != pin):
            todo.append(entry)
            diffs.append(FieldDiff(name, have, pin or "installed"))
    n = len(spec.apt.packages)
    if not todo:
        return ok(f"{n} package{'s' if n != 1 else ''} installed")
    kind: ChangeKind = Action.CREATE if all(d.old is None for d in diffs) else Action.CHANGE
    return change(
        kind,
        f"install {', '.join(todo)}",
        f"{len(todo)} of {n} packages not as the spec says",
        tuple(diffs),
        params={"packages": todo},
    )


def add_repositories(loaded: LoadedSpec, change: Change, progress: Progress) -> ActionResult:
    from actions import apt

    spec = loaded.spec
    assert spec.apt is not None
    results = [
        apt.add_repository(r, spec.apt.sources_dir)
        for r in spec.apt.repositories
        if r.name in change.params["repositories"]
    ]
    return ActionResult(any(r.changed for r in results), "; ".join(r.message for r in results))


def install(loaded: LoadedSpec, change: Change, progress: Progress) -> ActionResult:
    from actions import apt

    packages = list(change.params["packages"])
    names = [p.partition("=")[0] for p in packages]
    known = apt.apt_knows(names)
    # `apt-get update` only when a source was just added or apt does not know a package.
    return apt.install(packages, update=not all(known.values()))


def _apt_deps(spec: Spec) -> tuple[str, ...]:
    """`apt.repositories` (when the spec has any)"""
    return ("apt.repositories",) if spec.apt is not None and spec.apt.repositories else ()


PROBES = (
    Probe(  # dpkg-query (~10-25 ms of its own)
        "apt",
        "probes.apt",
        "apt",
        threaded=True,
        tags={
            "AptObservation": "apt",
            "PackageStatus": "apt.package",
            "AptSource": "apt.source",
            "Unparsed": "apt.unparsed",
        },
    ),
)
KINDS = (
    Kind("apt.repositories", "apt", ("apt",), plan_apt_repositories, add_repositories),
    Kind("apt", "apt", ("apt",), plan_apt, install, _apt_deps),
)
