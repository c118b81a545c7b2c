"""GPU probe: driver, CUDA driver version, each GPU and its compute processes, read through NVML.

Called by reconcile.plan.prober. `parse_nvidia_smi_csv` reads `nvidia-smi --query-gpu` output so NVML's
view can be compared with nvidia-smi's on a real machine. `cuda_mem_info` asks the CUDA driver itself
(what vLLM budgets from); it needs a context, so the plan uses `GpuDevice.cuda_total` instead.
"""

from __future__ import annotations

import contextlib
import ctypes

from probes.common import ParseError, ProbeFailure, Unavailable
from reconcile.record import Record
from reconcile.safety.display import shown

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from reconcile.spec.models import Spec

MIB = 1024 * 1024

# pynvml's error codes (NVML_ERROR_*), spelled out so the reasons read well without importing pynvml.
_NO_PERMISSION = 4
_DRIVER_NOT_LOADED = 9
_LIBRARY_NOT_FOUND = 12
_NOT_SUPPORTED = 3
_FUNCTION_NOT_FOUND = 13
_LIB_RM_VERSION_MISMATCH = 18

_INIT_REASONS = {
    _LIBRARY_NOT_FOUND: "NVML library not found (libnvidia-ml.so.1): no NVIDIA driver on this machine",
    _DRIVER_NOT_LOADED: "NVIDIA driver not loaded (nvmlInit: Driver Not Loaded): is the nvidia kernel module "
    "loaded? (lsmod | grep nvidia)",
    _NO_PERMISSION: "no permission to open the GPU devices (nvmlInit: Insufficient Permissions): check "
    "/dev/nvidia* access",
    _LIB_RM_VERSION_MISMATCH: "NVIDIA driver/library version mismatch (nvmlInit): reboot after the driver "
    "upgrade",
}


class GpuProcess(Record):
    """A compute process holding memory on a GPU, as NVML lists it."""

    pid: int
    # None when NVML cannot tell (it reports NVML_VALUE_NOT_AVAILABLE, e.g. without privileges).
    used_memory: int | None
    # From /proc/<pid>/comm; None when the pid is not visible here (another PID namespace, or gone).
    name: str | None


class GpuDevice(Record):
    index: int  # type: ignore[assignment]  # shadows tuple.index(), which records never use
    name: str
    uuid: str
    compute_capability: str  # "9.0", "12.0"
    # Bytes. From NVML's v2 memory info where the driver has it: `used` then excludes the driver's
    # `reserved` memory, as nvidia-smi's memory.used does; v1 (old drivers) counts it in `used`.
    memory_total: int
    memory_used: int
    memory_free: int
    memory_reserved: int | None  # None: only v1 memory info is available
    # Unavailable where NVML refuses to list processes (some containers and vGPU setups).
    processes: tuple[GpuProcess, ...] | Unavailable

    @property
    def cuda_total(self) -> int:
        """The total CUDA reports (cudaMemGetInfo, what vLLM's gpu-memory-utilization multiplies):
        NVML's total less the memory the driver reserves (615 MiB on an H200, driver 580). Old
        drivers without v2 memory info count the reserve as used: 616 MiB is taken off then."""
        from reconcile.vllm.budget import cuda_total  # the one conversion, shared with the oracle

        return cuda_total(self.memory_total, self.memory_reserved)


class GpuInventory(Record):
    """What NVML reports: the driver and every visible GPU."""

    driver_version: str  # "580.95.05"
    cuda_driver_version: str  # "13.0": the highest CUDA the driver supports
    gpus: tuple[GpuDevice, ...]

    @property
    def count(self) -> int:  # type: ignore[override]  # shadows tuple.count(), never used on records
        return len(self.gpus)


class NvidiaSmiGpu(Record):
    """One row of `nvidia-smi --query-gpu=index,name,uuid,driver_version,compute_cap,memory.*`."""

    index: int  # type: ignore[assignment]  # shadows tuple.index(), which records never use
    name: str
    uuid: str
    driver_version: str
    compute_capability: str
    memory_total: int  # bytes (nvidia-smi prints MiB)
    memory_used: int
    memory_free: int


NVIDIA_SMI_QUERY = (
    "nvidia-smi",
    "--query-gpu=index,name,uuid,driver_version,compute_cap,memory.total,memory.used,memory.free",
    "--format=csv,noheader,nounits",
)


def probe(spec: Spec, nvml: Any = None) -> GpuInventory | Unavailable | ProbeFailure:
    """Read the GPUs through NVML. `nvml` is the pynvml module (default) or a stand-in with its API."""
    del spec  # every GPU is reported; comparing with [gpu] is the planner's job
    if nvml is None:
        try:
            import pynvml
        except ImportError as exc:
            return Unavailable(f"pynvml (nvidia-ml-py) is not installed: {exc}")
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        code: int = getattr(exc, "value", -1)
        reason = _INIT_REASONS.get(code, f"nvmlInit failed: {exc} (NVML error {code})")
        return Unavailable(reason, raw=str(exc))
    try:
        return read_inventory(nvml)
    except nvml.NVMLError as exc:
        return ProbeFailure(f"NVML query failed: {exc}", raw=repr(exc))
    except ParseError as exc:
        return exc.as_failure("NVML")
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def read_inventory(nvml: Any) -> GpuInventory:
    """Assemble the inventory from an initialised NVML; NVML errors propagate to the caller."""
    gpus = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        total, used, free, reserved = _memory(nvml, handle)
        gpus.append(
            GpuDevice(
                index=index,
                name=_text(nvml.nvmlDeviceGetName(handle)),
                uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                compute_capability=f"{major}.{minor}",
                memory_total=total,
                memory_used=used,
                memory_free=free,
                memory_reserved=reserved,
                processes=_processes(nvml, handle),
            )
        )
    return GpuInventory(
        driver_version=_text(nvml.nvmlSystemGetDriverVersion()),
        cuda_driver_version=cuda_version_string(nvml.nvmlSystemGetCudaDriverVersion()),
        gpus=tuple(gpus),
    )


def _memory(nvml: Any, handle: object) -> tuple[int, int, int, int | None]:
    """(total, used, free, reserved) in bytes: v2 memory info when the binding and driver have it."""
    version = getattr(nvml, "nvmlMemory_v2", None)
    if version is not None:
        try:
            m = nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            return int(m.total), int(m.used), int(m.free), int(m.reserved)
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) not in (_FUNCTION_NOT_FOUND, _NOT_SUPPORTED):
                raise
    m = nvml.nvmlDeviceGetMemoryInfo(handle)
    return int(m.total), int(m.used), int(m.free), None


def _processes(nvml: Any, handle: object) -> tuple[GpuProcess, ...] | Unavailable:
    try:
        procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except nvml.NVMLError as exc:
        if getattr(exc, "value", None) in (_NOT_SUPPORTED, _NO_PERMISSION):
            return Unavailable(f"NVML cannot list compute processes here: {exc}", raw=str(exc))
        raise
    return tuple(
        GpuProcess(
            pid=int(p.pid),
            used_memory=None if p.usedGpuMemory is None else int(p.usedGpuMemory),
            name=process_name(int(p.pid)),
        )
        for p in procs
    )


def process_name(pid: int, proc: str = "/proc") -> str | None:
    try:
        with open(f"{proc}/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return shown(f.read().rstrip("\n"))  # the process sets its own comm: data from outside
    except OSError:
        return None


def _text(value: str | bytes) -> str:
    # nvidia-ml-py before 11.5 returned bytes for names, UUIDs and versions; later ones return str.
    return value.decode() if isinstance(value, bytes) else value


def cuda_version_string(version: int) -> str:
    """NVML's CUDA driver version integer -> "major.minor" (13000 -> "13.0", 12080 -> "12.8")."""
    if not isinstance(version, int) or version <= 0:
        raise ParseError(f"not a CUDA driver version: {version!r}", raw=repr(version))
    return f"{version // 1000}.{version % 1000 // 10}"


def parse_nvidia_smi_csv(text: str) -> tuple[NvidiaSmiGpu, ...]:
    """Parse NVIDIA_SMI_QUERY's output (CSV, no header, no units): one GPU per line."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 8:
            raise ParseError(f"expected 8 comma-separated fields, got {len(fields)}: {line!r}", raw=text)
        index, name, uuid, driver, cap, total, used, free = fields
        try:
            rows.append(
                NvidiaSmiGpu(
                    index=int(index),
                    name=name,
                    uuid=uuid,
                    driver_version=driver,
                    compute_capability=cap,
                    memory_total=int(total) * MIB,
                    memory_used=int(used) * MIB,
                    memory_free=int(free) * MIB,
                )
            )
        except ValueError as exc:
            raise ParseError(f"bad number in {line!r}: {exc}", raw=text) from None
    return tuple(rows)


def cuda_mem_info(index: int = 0, lib: str = "libcuda.so.1") -> tuple[int, int] | Unavailable:
    """(free, total) bytes from the CUDA driver (cuMemGetInfo in the device's primary context).

    Costs a CUDA context on the GPU (hundreds of MiB and a fraction of a second), so the plan does
    not call it; the lab oracle (tools/preflight_oracle.py) measures it against `cuda_total`.
    """
    try:
        cuda = ctypes.CDLL(lib)
    except OSError as exc:
        return Unavailable(f"CUDA driver library not loadable: {exc}")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    steps = (
        ("cuInit", (0,)),
        ("cuDeviceGet", (ctypes.byref(dev), index)),
        ("cuDevicePrimaryCtxRetain", (ctypes.byref(ctx), dev)),
        ("cuCtxSetCurrent", (ctx,)),
        ("cuMemGetInfo_v2", (ctypes.byref(free), ctypes.byref(total))),
    )
    try:
        for name, args in steps:
            rc = getattr(cuda, name)(*args)
            if rc != 0:
                return Unavailable(f"{name} failed (CUresult {rc})")
    finally:
        if ctx.value:
            cuda.cuDevicePrimaryCtxRelease(dev)
    return int(free.value), int(total.value)
