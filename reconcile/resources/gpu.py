"""The GPUs and their driver: checked against [gpu], never changed (outside apply's reach).

Declares (at the end) the gpu probe (probes.gpu) and the gpu kind, which has no action.
"""

from __future__ import annotations

from probes.common import ProbeFailure, Unavailable
from reconcile.plan.records import Action, FieldDiff, Item
from reconcile.resources.common import Kind, Probe, change, ok
from reconcile.vllm.versions import numbers

TYPE_CHECKING = False
if TYPE_CHECKING:
    from reconcile.resources import Observed
    from reconcile.spec.models import Spec


def plan_gpu(spec: Spec, obs: Observed) -> Item | None:
    want = spec.gpu
    if want is None:
        return None
    wanted = f"{want.count or 'any number of'}× {want.name or 'GPU'}" + (
        f" ({want.compute_capability})" if want.compute_capability else ""
    )
    inv = obs.gpu
    if isinstance(inv, (Unavailable, ProbeFailure)):
        return change(
            Action.CHANGE, f"unavailable: {inv.reason}", f"the spec wants {wanted}", actionable=False
        )
    assert inv is not None
    diffs: list[FieldDiff] = []
    if want.count is not None and inv.count != want.count:
        diffs.append(FieldDiff("count", inv.count, want.count))
    names = sorted({g.name for g in inv.gpus})
    if want.name and any(g.name != want.name for g in inv.gpus):
        diffs.append(FieldDiff("name", ", ".join(names), want.name))
    ccs = sorted({g.compute_capability for g in inv.gpus})
    if want.compute_capability and any(g.compute_capability != want.compute_capability for g in inv.gpus):
        diffs.append(FieldDiff("compute_capability", ", ".join(ccs), want.compute_capability))
    if want.min_driver and numbers(inv.driver_version) < numbers(want.min_driver):
        diffs.append(FieldDiff("driver", inv.driver_version, f">= {want.min_driver}"))
    seen = f"{inv.count}× {', '.join(names) or 'no GPU'} ({', '.join(ccs)}), driver {inv.driver_version}"
    if diffs:
        return change(
            Action.CHANGE,
            seen,
            f"the spec wants {wanted}; drivers and GPUs are outside apply's reach",
            tuple(diffs),
            actionable=False,
        )
    return ok(seen)


PROBES = (
    Probe(  # NVML's calls into the driver
        "gpu",
        "probes.gpu",
        "gpu",
        threaded=True,
        tags={
            "GpuInventory": "gpu",
            "GpuDevice": "gpu.device",
            "GpuProcess": "gpu.process",
            "NvidiaSmiGpu": "gpu.nvidia-smi",
        },
    ),
)
KINDS = (Kind("gpu", "gpu", ("gpu",), plan_gpu, None),)  # drivers and GPUs are outside apply's reach
