"""The CUDA toolkit: the CUDA_HOME symlink (apply points it), nvcc, its archs and headers (checked).

Rows of reconcile.resources; probe: probes.cuda; action: actions.cuda.
"""

from __future__ import annotations

from reconcile.engine.versions import numbers
from reconcile.plan.records import ActionResult, Change, FieldDiff, Item, Ok
from reconcile.resources.common import Progress, failed

TYPE_CHECKING = False
if TYPE_CHECKING:
    from reconcile.plan.prober import Observed
    from reconcile.plan.records import Kind
    from reconcile.spec.loaded import LoadedSpec
    from reconcile.spec.models import Spec


def plan_cuda_home(spec: Spec, obs: Observed) -> Item | None:
    if spec.cuda is None:
        return None
    if (bad := failed("cuda.home", obs.cuda, "cuda")) is not None:
        return bad
    from probes.cuda import CudaToolkit

    assert isinstance(obs.cuda, CudaToolkit)
    home, target = obs.cuda.home, spec.cuda.target
    shown = f"{home.path} -> {home.link_target}" if home.state == "symlink" else f"{home.path} ({home.state})"
    if target is None:
        if home.resolved is None:
            return Change(
                "cuda.home",
                "~",
                f"{home.path} is {home.state}",
                "CUDA_HOME must exist (set [cuda].target to let apply point it)",
                actionable=False,
            )
        return Ok("cuda.home", shown)
    import os

    if home.state == "symlink" and home.resolved is not None and home.resolved == os.path.realpath(target):
        return Ok("cuda.home", shown)
    if home.state == "directory":
        return Change(
            "cuda.home",
            "~",
            f"{home.path} is a real directory, not a symlink",
            f"move it aside (mv {home.path} {home.path}-old) and apply again; apply never deletes it",
            (FieldDiff("target", "(directory)", target),),
            actionable=False,
        )
    kind: Kind = "+" if home.state == "absent" else "~"
    return Change(
        "cuda.home",
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
    if (bad := failed("cuda", obs.cuda, "cuda")) is not None:
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
        return Ok("cuda", f"{found}; {len(obs.cuda.headers)} headers found")
    hint = _header_packages(missing, nvcc.release if isinstance(nvcc, Nvcc) else None)
    summary = "; ".join(f"{d.field}: {d.old}" for d in diffs)
    from reconcile.resources.facts import headers_via

    via = headers_via(
        spec, missing, [d.field for d in diffs], nvcc.release if isinstance(nvcc, Nvcc) else None
    )
    return Change(
        "cuda",
        "~",
        summary,
        f"[apt] packages bring them ({hint})"
        if via
        else "the toolkit comes from apt packages; add them to [apt].packages"
        + (f" ({hint})" if hint else ""),
        tuple(diffs),
        actionable=False,
        via=via,
    )


def _header_packages(headers: list[str], release: str | None) -> str:
    try:
        from reconcile.engine.failures import header_package
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
