"""GPU probe: the real no-driver path here, NVML data through the fake, and nvidia-smi's CSV."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import time
from pathlib import Path

import pynvml
import pytest

from probes import gpu
from probes.common import ParseError, ProbeFailure, Unavailable
from reconcile.spec import Spec
from tests.fakes import fake_nvml
from tests.fakes.fake_nvml import FakeGpu, FakeNvml, FakeProcess

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"
MIB = 1024 * 1024
SPEC = Spec.model_validate({"gpu": {"count": 1}})


def _has_nvml() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_has_nvml(), reason="this machine has an NVIDIA driver")
def test_machine_without_nvidia_driver_is_unavailable_with_the_reason() -> None:
    result = gpu.probe(SPEC)
    assert isinstance(result, Unavailable)
    assert result.reason == "NVML library not found (libnvidia-ml.so.1): no NVIDIA driver on this machine"


@pytest.mark.parametrize("nvml", [pynvml, FakeNvml([])], ids=["real-pynvml", "fake"])
def test_nvml_calls_before_init_raise_uninitialized(nvml: object) -> None:
    # The fake must fail the way the real binding does when the probe forgets nvmlInit.
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()  # type: ignore[attr-defined]


def test_fake_rejects_bad_index_and_use_after_shutdown_like_nvml() -> None:
    nvml = fake_nvml.h200()
    nvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(1)
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetName(handle)


def _exec_done(proc: subprocess.Popen[bytes], comm: str) -> None:
    # Popen returns after fork; /proc/<pid>/comm says "pytest" until the child has exec'd.
    deadline = time.monotonic() + 5
    while Path(f"/proc/{proc.pid}/comm").read_text().strip() != comm:
        assert time.monotonic() < deadline, "the child never exec'd"
        time.sleep(0.01)


def test_h200_inventory_with_a_process_named_from_proc() -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        _exec_done(sleeper, "sleep")
        nvml = fake_nvml.h200(processes=[FakeProcess(sleeper.pid, 4614 * MIB)])
        result = gpu.probe(SPEC, nvml=nvml)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert isinstance(result, gpu.GpuInventory)
    assert (result.driver_version, result.cuda_driver_version, result.count) == ("580.159.04", "13.0", 1)
    h200 = result.gpus[0]
    assert (h200.index, h200.name, h200.compute_capability) == (0, "NVIDIA H200", "9.0")
    assert h200.uuid.startswith("GPU-")
    assert (h200.memory_total, h200.memory_reserved) == (143771 * MIB, 615 * MIB)
    assert h200.memory_used == 4614 * MIB
    assert h200.memory_free == (143771 - 615 - 4614) * MIB
    assert h200.processes == (gpu.GpuProcess(sleeper.pid, 4614 * MIB, "sleep"),)
    assert nvml.refcount == 0, "the probe must shut NVML down again"


def test_process_that_is_gone_has_no_name_and_unknown_memory_stays_unknown() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    result = gpu.probe(SPEC, nvml=fake_nvml.h200(processes=[FakeProcess(gone.pid, None)]))
    assert isinstance(result, gpu.GpuInventory)
    assert result.gpus[0].processes == (gpu.GpuProcess(gone.pid, None, None),)


def test_two_rtx_5090s_of_the_reference_machine() -> None:
    result = gpu.probe(SPEC, nvml=fake_nvml.rtx5090_pair())
    assert isinstance(result, gpu.GpuInventory)
    assert result.driver_version == "580.95.05"
    assert [(g.index, g.name, g.compute_capability) for g in result.gpus] == [
        (0, "NVIDIA GeForce RTX 5090", "12.0"),
        (1, "NVIDIA GeForce RTX 5090", "12.0"),
    ]
    assert all(g.memory_total == 32607 * MIB and g.processes == () for g in result.gpus)


def test_old_binding_bytes_are_decoded() -> None:
    nvml = FakeNvml(
        [FakeGpu("NVIDIA H200", "GPU-1", (9, 0), 143771 * MIB)],
        driver_version="550.54.15",
        cuda_driver_version=12040,
        legacy_bytes=True,
    )
    result = gpu.probe(SPEC, nvml=nvml)
    assert isinstance(result, gpu.GpuInventory)
    assert (result.driver_version, result.cuda_driver_version) == ("550.54.15", "12.4")
    assert (result.gpus[0].name, result.gpus[0].uuid) == ("NVIDIA H200", "GPU-1")


def test_driver_without_memory_v2_falls_back_to_v1_counting_reserved_as_used() -> None:
    gpus = [
        FakeGpu("NVIDIA H200", "GPU-1", (9, 0), 1000 * MIB, memory_used=100 * MIB, memory_reserved=10 * MIB)
    ]
    result = gpu.probe(SPEC, nvml=FakeNvml(gpus, memory_v2=False))
    assert isinstance(result, gpu.GpuInventory)
    g = result.gpus[0]
    assert (g.memory_used, g.memory_free, g.memory_reserved) == (110 * MIB, 890 * MIB, None)


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML library not found (libnvidia-ml.so.1)"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "NVIDIA driver not loaded"),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "version mismatch"),
        (pynvml.NVML_ERROR_UNKNOWN, "nvmlInit failed: Unknown Error"),
    ],
)
def test_nvml_init_failure_is_unavailable_with_a_reason(code: int, reason: str) -> None:
    result = gpu.probe(SPEC, nvml=FakeNvml([], init_error=code))
    assert isinstance(result, Unavailable)
    assert reason in result.reason


def test_gpu_lost_during_the_query_is_a_failure_and_nvml_is_shut_down() -> None:
    nvml = fake_nvml.h200()
    nvml.gpus[0].lost = True
    result = gpu.probe(SPEC, nvml=nvml)
    assert isinstance(result, ProbeFailure)
    assert "GPU is lost" in result.reason
    assert nvml.refcount == 0


def test_process_listing_refused_leaves_the_rest_of_the_inventory() -> None:
    nvml = fake_nvml.h200()
    nvml.gpus[0].processes_error = pynvml.NVML_ERROR_NO_PERMISSION
    result = gpu.probe(SPEC, nvml=nvml)
    assert isinstance(result, gpu.GpuInventory)
    assert isinstance(result.gpus[0].processes, Unavailable)
    assert result.gpus[0].name == "NVIDIA H200"


@pytest.mark.parametrize(
    ("value", "text"), [(13000, "13.0"), (12080, "12.8"), (12090, "12.9"), (11080, "11.8")]
)
def test_cuda_driver_version_integer_to_text(value: int, text: str) -> None:
    assert gpu.cuda_version_string(value) == text


def test_nvidia_smi_csv_of_the_lab_h200() -> None:
    (row,) = gpu.parse_nvidia_smi_csv((FIXTURES / "h200-idle.csv").read_text())
    assert row == gpu.NvidiaSmiGpu(
        0,
        "NVIDIA H200",
        "GPU-aa49ebdb-ff19-3d84-6f5f-71c63c094e82",
        "580.159.04",
        "9.0",
        143771 * MIB,
        0,
        143156 * MIB,
    )


def test_nvidia_smi_csv_of_the_reference_5090_pair() -> None:
    rows = gpu.parse_nvidia_smi_csv((FIXTURES / "rtx5090x2.csv").read_text())
    assert [(r.index, r.compute_capability, r.driver_version, r.memory_total) for r in rows] == [
        (0, "12.0", "580.95.05", 32607 * MIB),
        (1, "12.0", "580.95.05", 32607 * MIB),
    ]


@pytest.mark.parametrize(
    "text",
    [
        "0, NVIDIA H200, GPU-1, 580.159.04, 9.0, 143771, 0\n",
        "0, NVIDIA H200, GPU-1, 580.159.04, 9.0, [N/A], 0, 1\n",
    ],
)
def test_nvidia_smi_csv_that_does_not_parse_is_an_error_with_the_text(text: str) -> None:
    with pytest.raises(ParseError) as err:
        gpu.parse_nvidia_smi_csv(text)
    assert err.value.raw == text


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("nvidia-smi") is None or not _has_nvml(), reason="needs an NVIDIA GPU")
def test_nvml_probe_agrees_with_nvidia_smi_on_a_real_gpu() -> None:
    smi = gpu.parse_nvidia_smi_csv(
        subprocess.run(gpu.NVIDIA_SMI_QUERY, capture_output=True, text=True, check=True).stdout
    )
    result = gpu.probe(SPEC)
    assert isinstance(result, gpu.GpuInventory), result
    assert len(smi) == result.count
    for row, dev in zip(smi, result.gpus, strict=True):
        assert (row.index, row.name, row.uuid, row.compute_capability, row.memory_total) == (
            dev.index,
            dev.name,
            dev.uuid,
            dev.compute_capability,
            dev.memory_total,
        )
        assert row.driver_version == result.driver_version
        # Two reads a moment apart, rounded to MiB by nvidia-smi: allow a little drift.
        assert abs(row.memory_used - dev.memory_used) <= 64 * MIB
        assert abs(row.memory_free - dev.memory_free) <= 64 * MIB


def test_nonsense_cuda_driver_version_is_a_failure_not_a_guess() -> None:
    result = gpu.probe(SPEC, nvml=FakeNvml([], cuda_driver_version=0))
    assert isinstance(result, ProbeFailure)
    assert result.reason == "NVML: not a CUDA driver version: 0"


def test_cuda_total_leaves_out_what_the_driver_reserves() -> None:
    # vLLM budgets gpu-memory-utilization x cudaMemGetInfo's total, which has no driver reserve.
    result = gpu.probe(SPEC, nvml=fake_nvml.h200())
    assert isinstance(result, gpu.GpuInventory)
    assert result.gpus[0].cuda_total == (143771 - 615) * MIB


def test_cuda_total_without_memory_v2_takes_off_the_h200_reserve() -> None:
    gpus = [FakeGpu("NVIDIA H200", "GPU-1", (9, 0), 143771 * MIB, memory_reserved=615 * MIB)]
    result = gpu.probe(SPEC, nvml=FakeNvml(gpus, memory_v2=False))
    assert isinstance(result, gpu.GpuInventory)
    assert result.gpus[0].cuda_total == (143771 - 616) * MIB


def test_cuda_mem_info_without_the_driver_library_is_unavailable() -> None:
    result = gpu.cuda_mem_info(lib="libcuda-not-here.so.1")
    assert isinstance(result, Unavailable) and "not loadable" in result.reason


@pytest.mark.gpu
@pytest.mark.skipif(not _has_nvml(), reason="needs an NVIDIA GPU")
def test_cuda_total_matches_the_cuda_driver_on_a_real_gpu() -> None:
    result = gpu.probe(SPEC)
    assert isinstance(result, gpu.GpuInventory), result
    started = time.monotonic()
    cuda = gpu.cuda_mem_info(0)
    took = time.monotonic() - started
    assert not isinstance(cuda, Unavailable), cuda
    nvml_based = result.gpus[0].cuda_total
    print(f"cuMemGetInfo total {cuda[1]:,} B in {took:.3f} s; NVML total - reserved {nvml_based:,} B")
    assert cuda[1] == result.gpus[0].cuda_total
