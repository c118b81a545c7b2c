"""CUDA toolchain knowledge FlashInfer's JIT depends on: the apt package of each header, the nvcc each
GPU arch needs, and the `compute_XY` names nvcc lists. Used by the preflight and by failures.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# Header -> the apt package (NVIDIA's CUDA repository) that ships it, without the -X-Y suffix.
HEADER_PACKAGES: Mapping[str, str] = {
    "curand_kernel.h": "libcurand-dev",
    "curand.h": "libcurand-dev",
    "cublasLt.h": "libcublas-dev",
    "cublas_v2.h": "libcublas-dev",
    "cublas.h": "libcublas-dev",
    "nvrtc.h": "cuda-nvrtc-dev",
    "cusparse.h": "libcusparse-dev",
    "cusolverDn.h": "libcusolver-dev",
    "cufft.h": "libcufft-dev",
    "cuda_runtime.h": "cuda-cudart-dev",
    "cuda_runtime_api.h": "cuda-cudart-dev",
    "cuda.h": "cuda-driver-dev",
    "nvml.h": "cuda-nvml-dev",
    "cub/cub.cuh": "cuda-cccl",
    "thrust/device_vector.h": "cuda-cccl",
    "cuda/std/cstdint": "cuda-cccl",
}
# Libraries packaged per CUDA major only ("-cuda-13"), as the article installs them.
MAJOR_ONLY: Mapping[str, str] = {"cusparseLt.h": "libcusparselt0-dev-cuda", "cudnn.h": "libcudnn9-dev-cuda"}


def cuda_suffix(version: str | None) -> str | None:
    """ "13.0", "13.0.88", "/usr/local/cuda-13.0" -> "13-0"."""
    m = re.search(r"(\d+)\.(\d+)", version or "")
    return f"{m.group(1)}-{m.group(2)}" if m else None


def header_package(header: str, cuda_version: str | None) -> str | None:
    """The apt package that brings `header` for toolkit `cuda_version` ("X-Y" placeholder when unknown)."""
    name = header.strip().lstrip("<").rstrip(">")
    suffix = cuda_suffix(cuda_version)
    if name in MAJOR_ONLY:
        return f"{MAJOR_ONLY[name]}-{suffix.split('-')[0] if suffix else 'X'}"
    base = HEADER_PACKAGES.get(name) or HEADER_PACKAGES.get(name.rsplit("/", 1)[-1])
    if base is None:
        return None
    return f"{base}-{suffix or 'X-Y'}"


def compute_arch(capability: str) -> str:
    """ "12.0" -> "compute_120" (what `nvcc --list-gpu-arch` prints for the GPU)."""
    major, _, minor = capability.partition(".")
    return f"compute_{int(major)}{int(minor or 0)}"


def min_cuda_for(capability: str) -> tuple[int, int] | None:
    """The oldest nvcc that FlashInfer's JIT accepts for a compute capability; None below sm_75.

    sm_12x needs 12.9 (FlashInfer: "SM 12.x requires CUDA >= 12.9"; it builds 120f), sm_100 12.8,
    sm_90 12.0 (90a), sm_89 11.8, sm_8x 11.0-11.4, sm_75 10.0.
    """
    major, _, minor_s = capability.partition(".")
    cc = (int(major), int(minor_s or 0))
    if cc >= (12, 0):
        return 12, 9
    if cc >= (10, 0):
        return 12, 8
    table = {(9, 0): (12, 0), (8, 9): (11, 8), (8, 7): (11, 4), (8, 6): (11, 1), (8, 0): (11, 0)}
    if cc in table:
        return table[cc]
    return (10, 0) if cc >= (7, 5) else None
