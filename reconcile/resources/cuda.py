"""The CUDA toolkit: the CUDA_HOME symlink (apply points it), nvcc, its archs and headers (checked).

Declares (at the end) the cuda probe (probes.cuda) and the cuda.home and cuda kinds; action:
actions.cuda.
"""

from __future__ import annotations

from reconcile.plan.records import Action, ActionResult, Change, FieldDiff, Item
from reconcile.resources.common import Kind, Probe, Progress, change, failed, needs, ok
from reconcile.vllm.versions import numbers

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from reconcile.plan.records import ChangeKind
    from reconcile.resources import Observed
    from reconcile.spec.loaded import LoadedSpec
    from reconcile.spec.models import Spec


def plan_cuda_home(spec: Spec, obs: Observed) -> Item | None:
    if spec.cuda is None:
        return None
    if (bad := failed(obs.cuda, "cuda")) is not None:
        return bad
    from probes.cuda import CudaToolkit

    assert isinstance(obs.cuda, CudaToolkit)
    home, target = obs.cuda.home, spec.cuda.target
    shown = f"{home.path} -> {home.link_target}" if home.state == "symlink" else f"{home.path} ({home.state})"
    if target is None:
        if home.resolved is None:
            return change(
                Action.CHANGE,
                f"{home.path} is {home.state}",
                "CUDA_HOME must exist (set [cuda].target to let apply point it)",
                actionable=False,
            )
        return ok(shown)
    import os

    if home.state == "symlink" and home.resolved is not None and home.resolved == os.path.realpath(target):
        return ok(shown)
    if home.state == "directory":
        return change(
            Action.CHANGE,
            f"{home.path} is a real directory, not a symlink",
            f"move it aside (mv {home.path} {home.path}-old) and apply again; apply never deletes it",
            (FieldDiff("target", "(directory)", target),),
            actionable=False,
        )
    kind: ChangeKind = Action.CREATE if home.state == "absent" else Action.CHANGE
    return change(
        kind,
        f"{shown}  =>  {target}",
        "nvcc under CUDA_HOME must be the toolkit the spec names",
        (FieldDiff("target", home.link_target, target),),
        params={"home": home.path, "target": target},
    )


def plan_cuda(spec: Spec, obs: Observed) -> Item | None:
    """nvcc, its arch list and the headers: brought by apt packages, so only checked here."""
    if spec.cuda is None:
        return None
    if (bad := failed(obs.cuda, "cuda")) is not None:
        return bad
    from probes.cuda import CudaToolkit, Nvcc

    assert isinstance(obs.cuda, CudaToolkit)
    want = spec.cuda
    diffs: list[FieldDiff] = []
    nvcc = obs.cuda.nvcc
    if not isinstance(nvcc, Nvcc):
        # why there is none to ask (absent, or refused: another user's nvcc is never run)
        diffs.append(FieldDiff("nvcc", getattr(nvcc, "reason", None), f"{want.home}/bin/nvcc"))
        archs: tuple[str, ...] = ()
    else:
        archs = nvcc.gpu_archs
        if want.min_version and numbers(nvcc.release) < numbers(want.min_version):
            diffs.append(FieldDiff("nvcc.release", nvcc.release, f">= {want.min_version}"))
        missing_arch = [a for a in want.gpu_arch if a not in archs]
        if missing_arch:
            diffs.append(
                FieldDiff(
                    "nvcc --list-gpu-arch",
                    " ".join(archs) or "(empty)",
                    "includes " + ", ".join(missing_arch),
                )
            )
    missing = [h.name for h in obs.cuda.headers if not h.paths]
    if missing:
        diffs.append(FieldDiff("headers.missing", ", ".join(missing), "(none)"))
    if not diffs:
        found = (
            f"nvcc {nvcc.version} lists {', '.join(want.gpu_arch) or 'its archs'}"
            if isinstance(nvcc, Nvcc)
            else "nvcc"
        )
        return ok(f"{found}; {len(obs.cuda.headers)} headers found")
    hint = _header_packages(missing, nvcc.release if isinstance(nvcc, Nvcc) else None)
    summary = "; ".join(f"{d.field}: {d.old}" for d in diffs)
    brought_by = headers_brought_by(
        spec, missing, [d.field for d in diffs], nvcc.release if isinstance(nvcc, Nvcc) else None
    )
    return change(
        Action.CHANGE,
        summary,
        f"[apt] packages bring them ({hint})"
        if brought_by
        else "the toolkit comes from apt packages; add them to [apt].packages"
        + (f" ({hint})" if hint else ""),
        tuple(diffs),
        actionable=False,
        made_true_by=brought_by,
    )


def _header_packages(headers: list[str], release: str | None) -> str:
    try:
        from reconcile.vllm.failures import header_package
    except ImportError:
        return ""
    out = []
    for h in headers:
        pkg = header_package(h, release)
        if pkg:
            out.append(f"{h} <- {pkg}")
    return ", ".join(out)


def point_home(loaded: LoadedSpec, change: Change, progress: Progress) -> ActionResult:
    from actions import cuda

    return cuda.point_home(str(change.params["home"]), str(change.params["target"]))


def headers_brought_by(
    spec: Spec, missing: Sequence[str], fields: Sequence[str], release: str | None
) -> str | None:
    """ "apt" when headers are all that is missing from the toolkit and [apt] packages lists the package
    of every one: the apt change brings them, the cuda row only waits for it (None otherwise)."""
    from reconcile.vllm.failures import header_package

    if not missing or spec.apt is None or any(f != "headers.missing" for f in fields):
        return None
    listed = {p.partition("=")[0] for p in spec.apt.packages}
    packages = [header_package(h, release) for h in missing]
    return "apt" if all(p is not None and p in listed for p in packages) else None


def _cuda_home_deps(spec: Spec) -> tuple[str, ...]:
    """`apt` (when the spec has `[apt]`)"""
    return ("apt",) if spec.apt is not None else ()


PROBES = (
    Probe(  # nvcc, when its answers are not remembered
        "cuda",
        "probes.cuda",
        "cuda",
        threaded=True,
        tags={"CudaToolkit": "cuda", "CudaHome": "cuda.home", "Nvcc": "cuda.nvcc", "Header": "cuda.header"},
    ),
)
KINDS = (
    Kind("cuda.home", "cuda", ("cuda",), plan_cuda_home, point_home, _cuda_home_deps),
    # nvcc and headers come from apt packages: apply never acts on this row
    Kind("cuda", "cuda", ("cuda",), plan_cuda, None, needs("apt", "cuda.home")),
)
