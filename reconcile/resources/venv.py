"""The virtual environment and its packages: plan items and the actions that make them true.

Declares (at the end) the venv probe (probes.venv) and the venv and venv.packages kinds; action:
actions.venv.
"""

from __future__ import annotations

import functools
import os
import re

from probes.common import Absent, Invalid, ProbeFailure
from reconcile.plan.records import Action, ActionResult, Change, FieldDiff, Item
from reconcile.resources.common import Kind, Probe, Progress, change, failed, needs, ok

TYPE_CHECKING = False
if TYPE_CHECKING:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    from probes.venv import VenvObservation
    from reconcile.plan.records import ChangeKind
    from reconcile.resources import Observed
    from reconcile.spec.loaded import LoadedSpec
    from reconcile.spec.models import Spec, Venv


def plan_venv(spec: Spec, obs: Observed) -> Item | None:
    if spec.venv is None:
        return None
    want = spec.venv
    v = obs.venv
    if isinstance(v, ProbeFailure):
        return failed(v, "venv")
    if isinstance(v, Absent):
        return change(
            Action.CREATE,
            f"create {want.path} with {want.python}",
            "the venv does not exist",
            (FieldDiff("path", None, want.path),),
        )
    if isinstance(v, Invalid):
        return change(
            Action.CHANGE,
            f"{want.path}: {v.message}",
            "not a virtual environment; move it aside and apply again (apply never deletes it)",
            actionable=False,
        )
    assert v is not None
    diffs: list[FieldDiff] = []
    if isinstance(v.interpreter, Absent) or v.interpreter.resolved is None:
        diffs.append(FieldDiff("interpreter", None, want.python))
    if v.include_system_site_packages != want.system_site_packages:
        diffs.append(
            FieldDiff("system_site_packages", v.include_system_site_packages, want.system_site_packages)
        )
    have_pth = {p.path for p in v.pth_paths}
    for extra in want.extra_site_packages:
        if extra not in have_pth:
            diffs.append(FieldDiff("extra_site_packages", None, extra))
    reason = "the venv differs from the spec"
    if _needs_pip(want, v):
        # What a `python -m venv` killed during ensurepip leaves: the venv exists, pip does not.
        diffs.append(FieldDiff("pip", None, "installed"))
        reason = "pip is missing (a venv whose creation was interrupted): it cannot install the packages"
    if diffs:
        return change(Action.CHANGE, f"fix {want.path}", reason, tuple(diffs))
    return ok(f"{want.path} (Python {v.version or '?'})")


def _needs_pip(want: Venv, v: VenvObservation) -> bool:
    """pip is absent, and packages are to be installed with it."""
    if "pip" in v.distributions:
        return False
    satisfied = all(_satisfies(v.version_of(n), s) for n, s in want.packages.items())
    _answers().save()
    if satisfied:
        return False
    from actions.venv import installer_for

    return installer_for(want) == "pip"


def plan_venv_packages(spec: Spec, obs: Observed) -> Item | None:
    if spec.venv is None or not spec.venv.packages:
        return None
    from probes.venv import VenvObservation

    v = obs.venv
    installed = v if isinstance(v, VenvObservation) else None
    named = {_norm(k) for k in spec.venv.packages}
    wanted: dict[str, str] = {}
    diffs: list[FieldDiff] = []
    locked = closure_pins(spec.venv)
    for name, spec_text in {**locked, **spec.venv.packages}.items():
        if name in locked and _norm(name) in named and name not in spec.venv.packages:
            continue  # the spec names it (perhaps spelt otherwise): its own line says what it needs
        have = installed.version_of(name) if installed else None
        if not _satisfies(have, spec_text):
            wanted[name] = spec_text
            diffs.append(FieldDiff(name, have, spec_text))
    _answers().save()
    n = len(spec.venv.packages)
    locked_note = f"; {len(locked)} locked with hashes" if locked else ""
    if not wanted:
        assert installed is not None
        shown = ", ".join(f"{k} {installed.version_of(k)}" for k in list(spec.venv.packages)[:3])
        return ok(
            f"{n} package{'s' if n != 1 else ''} satisfied ({shown}{', …' if n > 3 else ''}){locked_note}"
        )
    kind: ChangeKind = Action.CREATE if all(d.old is None for d in diffs) else Action.CHANGE
    own = [k for k in wanted if k in spec.venv.packages]
    rest = [k for k in wanted if k not in spec.venv.packages]
    listed = own + rest if len(rest) <= 3 else own
    shown = ", ".join(f"{k}{'' if wanted[k] == '*' else wanted[k]}" for k in listed)
    if len(rest) > 3:
        shown += f"{', ' if own else ''}{len(rest)} more from the lock"
    return change(
        kind,
        f"install {shown}",
        f"{len(wanted)} of {len(set(locked) | {_norm(k) for k in spec.venv.packages})} packages missing "
        f"or not satisfying the {'lock' if locked else 'spec'}",
        tuple(diffs),
        params={"packages": wanted},
    )


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure_pins(venv: Venv) -> dict[str, str]:
    """{name: "==version"} of every distribution the lock's closure holds (empty without one)."""
    from reconcile.safety.names import LOCKED

    found = (re.match(LOCKED, line) for line in getattr(venv, "closure", None) or ())
    return {m.group(1): f"=={m.group(2)}" for m in found if m}


def _satisfies(version: str | None, spec_text: str) -> bool:
    if version is None:
        return False
    if spec_text == "*":
        return True
    return _answers().get(version, spec_text)


class _Satisfied:
    """Whether a version satisfies a requirement, remembered across runs in a private marshal file
    (reconcile.private_cache) under packaging's own files' stamps: a pure function of the two
    strings and packaging's code. A converged plan of pinned packages then imports no packaging
    (~10 ms: its version and specifier regexes) and parses no SpecifierSet (~30 ms at 500 packages)."""

    def __init__(self) -> None:
        from reconcile import private_cache

        self.head = (
            1,
            private_cache.package_stamps("packaging", ("specifiers.py", "version.py", "utils.py")),
        )
        self.path = os.path.join(private_cache.cache_root(), "satisfies.marshal")
        data = private_cache.read(self.path)
        ok = isinstance(data, tuple) and len(data) == 2 and data[0] == self.head and isinstance(data[1], dict)
        self.known: dict[tuple[str, str], bool] = data[1] if ok else {}
        self.added = False

    def get(self, version: str, spec_text: str) -> bool:
        found = self.known.get((version, spec_text))
        if type(found) is bool:
            return found
        answer = _contains(version, spec_text)
        self.known[(version, spec_text)] = answer
        self.added = True
        return answer

    def save(self) -> None:
        if self.added and len(self.known) <= 100_000:
            from reconcile import private_cache

            private_cache.write(self.path, (self.head, self.known))
            self.added = False


@functools.cache
def _answers() -> _Satisfied:
    return _Satisfied()


@functools.lru_cache(maxsize=4096)
def _contains(version: str, spec_text: str) -> bool:
    """packaging's answer: a bad specifier raises, a version packaging cannot parse is not satisfied."""
    from packaging.version import InvalidVersion

    specifier = _specifier(spec_text)  # first, as before: a bad specifier raises, a bad version is False
    try:
        return specifier.contains(_version(version))
    except InvalidVersion:
        return False


@functools.lru_cache(maxsize=1024)
def _specifier(spec_text: str) -> SpecifierSet:
    from packaging.specifiers import SpecifierSet

    return SpecifierSet(spec_text, prereleases=True)


@functools.lru_cache(maxsize=4096)
def _version(version: str) -> Version:
    from packaging.version import Version

    return Version(version)


def create(loaded: LoadedSpec, change: Change, progress: Progress) -> ActionResult:
    from actions import venv

    assert loaded.spec.venv is not None
    return venv.create(loaded.spec.venv)


def install(loaded: LoadedSpec, change: Change, progress: Progress) -> ActionResult:
    from actions import venv

    assert loaded.spec.venv is not None
    return venv.install(loaded.spec.venv, dict(change.params["packages"]))


PROBES = (
    Probe(
        "venv",
        "probes.venv",
        "venv",
        tags={
            "VenvObservation": "venv",
            "Distribution": "venv.distribution",
            "PthEntry": "venv.pth",
            "Interpreter": "venv.interpreter",
        },
    ),
)
KINDS = (
    Kind("venv", "venv", ("venv",), plan_venv, create),
    Kind(
        "venv.packages", "venv", ("venv",), plan_venv_packages, install, needs("venv"), restarts_server=True
    ),
)
