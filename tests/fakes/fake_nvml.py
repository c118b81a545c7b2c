"""A stand-in for the pynvml module on machines without an NVIDIA GPU, built from a description.

It raises the real `pynvml.NVMLError` subclasses with the real codes (Uninitialized before
nvmlInit or after the last nvmlShutdown, Invalid Argument for a bad index or a foreign handle),
keeps nvmlInit/nvmlShutdown reference counted like libnvidia-ml, and returns process objects with
.pid and .usedGpuMemory. `legacy_bytes=True` mimics nvidia-ml-py < 11.5, which returned bytes.
`HeldNvml` ties it to the fake vllm: a process holding its "GPU memory" lock is listed on that GPU.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

import pynvml

NVMLError = pynvml.NVMLError
NVML_ERROR_UNINITIALIZED = pynvml.NVML_ERROR_UNINITIALIZED
NVML_ERROR_INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT
NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
NVML_ERROR_NO_PERMISSION = pynvml.NVML_ERROR_NO_PERMISSION
NVML_ERROR_DRIVER_NOT_LOADED = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
NVML_ERROR_LIBRARY_NOT_FOUND = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
NVML_ERROR_GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
NVML_ERROR_FUNCTION_NOT_FOUND = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
nvmlMemory_v2 = pynvml.nvmlMemory_v2

GIB = 1024**3
MIB = 1024**2


@dataclass
class FakeProcess:
    pid: int
    used_gpu_memory: int | None  # None: NVML_VALUE_NOT_AVAILABLE, which pynvml turns into None


@dataclass
class FakeGpu:
    name: str
    uuid: str
    compute_capability: tuple[int, int]
    memory_total: int
    memory_used: int = 0  # as v2 counts it: without `memory_reserved`
    memory_reserved: int = 0
    processes: list[FakeProcess] = field(default_factory=list)
    processes_error: int | None = None  # an NVML error code the process query raises
    lost: bool = False  # every query on this GPU raises GPU_IS_LOST


class _Memory:
    """Like pynvml's c_nvmlMemory_t (v1: .total .free .used) or c_nvmlMemory_v2_t (+ .version .reserved)."""

    def __init__(self, gpu: FakeGpu, version: int | None) -> None:
        self.total = gpu.memory_total
        self.free = gpu.memory_total - gpu.memory_used - gpu.memory_reserved
        if version is None:  # v1 counts the driver's reserved memory as used
            self.used = gpu.memory_used + gpu.memory_reserved
        else:
            self.version, self.reserved, self.used = version, gpu.memory_reserved, gpu.memory_used


class _ProcessInfo:
    """Like pynvml's friendly object for c_nvmlProcessInfo_v3_t."""

    def __init__(self, proc: FakeProcess) -> None:
        self.pid = proc.pid
        self.usedGpuMemory = proc.used_gpu_memory
        self.gpuInstanceId = 0xFFFFFFFF
        self.computeInstanceId = 0xFFFFFFFF


class _Handle:
    """Opaque like c_nvmlDevice_t; only the FakeNvml that made it accepts it."""

    def __init__(self, owner: FakeNvml, index: int) -> None:
        self.owner, self.index = owner, index


class FakeNvml:
    """The subset of pynvml that probes and actions use, over a described machine."""

    NVMLError = pynvml.NVMLError
    nvmlMemory_v2 = pynvml.nvmlMemory_v2

    def __init__(
        self,
        gpus: list[FakeGpu],
        *,
        driver_version: str = "580.159.04",
        cuda_driver_version: int = 13000,
        init_error: int | None = None,
        legacy_bytes: bool = False,
        memory_v2: bool = True,
    ) -> None:
        self.gpus = gpus
        self.driver_version = driver_version
        self.cuda_driver_version = cuda_driver_version
        self.init_error = init_error
        self.legacy_bytes = legacy_bytes
        self.memory_v2 = memory_v2  # False: a driver without nvmlDeviceGetMemoryInfo_v2
        self.refcount = 0
        self.init_calls = 0

    # --- lifetime -----------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.refcount += 1

    def nvmlShutdown(self) -> None:
        self._check_init()
        self.refcount -= 1

    # --- system -------------------------------------------------------------------------------
    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        self._check_init()
        return self._str(self.driver_version)

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check_init()
        return self.cuda_driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._check_init()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._check_init()
        if not isinstance(index, int) or not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(self, index)

    # --- per device ---------------------------------------------------------------------------
    def nvmlDeviceGetName(self, handle: _Handle) -> str | bytes:
        return self._str(self._gpu(handle).name)

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str | bytes:
        return self._str(self._gpu(handle).uuid)

    def nvmlDeviceGetCudaComputeCapability(self, handle: _Handle) -> tuple[int, int]:
        return self._gpu(handle).compute_capability

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> _Memory:
        gpu = self._gpu(handle)
        if version is not None and not self.memory_v2:
            raise pynvml.NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        if version not in (None, nvmlMemory_v2):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return _Memory(gpu, version)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[_ProcessInfo]:
        gpu = self._gpu(handle)
        if gpu.processes_error is not None:
            raise pynvml.NVMLError(gpu.processes_error)
        return [_ProcessInfo(p) for p in gpu.processes]

    # --- helpers ------------------------------------------------------------------------------
    def _check_init(self) -> None:
        if self.refcount <= 0:
            raise pynvml.NVMLError(NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle: _Handle) -> FakeGpu:
        self._check_init()
        if not isinstance(handle, _Handle) or handle.owner is not self:
            raise pynvml.NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise pynvml.NVMLError(NVML_ERROR_GPU_IS_LOST)
        return gpu

    def _str(self, value: str) -> str | bytes:
        return value.encode() if self.legacy_bytes else value


def lock_holders(hold: str) -> dict[int, int]:
    """GPU index -> pid holding `<hold>/cuda<index>.lock` (the fake vllm's GPU memory), read from
    /proc/locks, the kernel's own table: taking the lock to test it would race a worker starting.
    A lock's inode is matched, then the pid's open files (an overlay's device numbers differ)."""
    files: dict[int, tuple[int, str]] = {}
    for name in os.listdir(hold) if os.path.isdir(hold) else []:
        if name.startswith("cuda") and name.endswith(".lock") and name[4:-5].isdigit():
            path = os.path.realpath(os.path.join(hold, name))
            files[os.stat(path).st_ino] = (int(name[4:-5]), path)
    out: dict[int, int] = {}
    with open("/proc/locks") as f:
        for line in f:
            cols = line.split()  # "1: FLOCK  ADVISORY  WRITE 1965 fe:00:2146354 0 EOF"; waiters have "->"
            if len(cols) < 6 or cols[1] != "FLOCK":
                continue
            found = files.get(int(cols[5].rsplit(":", 1)[1]))
            if found is not None and _has_open(int(cols[4]), found[1]):
                out[found[0]] = int(cols[4])
    return out


def _has_open(pid: int, path: str) -> bool:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == path:
                return True
        except OSError:
            continue
    return False


class HeldNvml(FakeNvml):
    """A FakeNvml whose GPU i also lists the process that holds the fake vllm's `cuda<i>.lock` under
    `hold`, using `per_process` bytes: there while the process lives, released when it exits (the
    kernel drops the lock), as the driver frees a dead process's memory. Each query reads it afresh."""

    def __init__(self, gpus: list[FakeGpu], hold: str, per_process: int, **kw: object) -> None:
        super().__init__(gpus, **kw)  # type: ignore[arg-type]
        self.hold, self.per_process = hold, per_process

    def _with_holders(self, handle: _Handle) -> FakeGpu:
        gpu = self._gpu(handle)
        pid = lock_holders(self.hold).get(handle.index)
        if pid is None:
            return gpu
        return dataclasses.replace(
            gpu,
            memory_used=gpu.memory_used + self.per_process,
            processes=[*gpu.processes, FakeProcess(pid, self.per_process)],
        )

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> _Memory:
        super().nvmlDeviceGetMemoryInfo(handle, version)  # its errors
        return _Memory(self._with_holders(handle), version)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[_ProcessInfo]:
        super().nvmlDeviceGetComputeRunningProcesses(handle)  # its errors
        return [_ProcessInfo(p) for p in self._with_holders(handle).processes]


def h200(count: int = 1, processes: list[FakeProcess] | None = None, hold: str | None = None) -> FakeNvml:
    """The lab machine: NVIDIA H200, 143771 MiB, driver 580.159.04, CUDA 13.0. With `hold`, a HeldNvml:
    each fake vllm worker holding a GPU there shows 43.6 GiB on it, as each TP 2 worker did on the lab."""
    gpus = [
        FakeGpu(
            name="NVIDIA H200",
            uuid=f"GPU-6f1c2a9e-3b7d-4c55-9a1e-0d8b7c6e5f4{i}",
            compute_capability=(9, 0),
            memory_total=143771 * MIB,
            memory_reserved=615 * MIB,  # what nvidia-smi showed on the lab H200: 143771 - 0 - 143156
            memory_used=sum(p.used_gpu_memory or 0 for p in processes or []) if i == 0 else 0,
            processes=list(processes or []) if i == 0 else [],
        )
        for i in range(count)
    ]
    if hold is not None:
        return HeldNvml(gpus, hold, int(43.6 * GIB), driver_version="580.159.04", cuda_driver_version=13000)
    return FakeNvml(gpus, driver_version="580.159.04", cuda_driver_version=13000)


def rtx5090_pair() -> FakeNvml:
    """The reference machine: 2x GeForce RTX 5090, 32607 MiB, driver 580.95.05, CUDA 13.0."""
    gpus = [
        FakeGpu(
            name="NVIDIA GeForce RTX 5090",
            uuid=f"GPU-0a4e9c1b-7d2f-4e8a-b5c3-9f1d2e3a4b5{i}",
            compute_capability=(12, 0),
            memory_total=32607 * MIB,
        )
        for i in range(2)
    ]
    return FakeNvml(gpus, driver_version="580.95.05", cuda_driver_version=13000)
