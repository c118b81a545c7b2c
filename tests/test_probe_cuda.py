"""CUDA probe: this machine's real toolkit, and toolkit trees in temp dirs with an nvcc script
that prints recorded nvcc outputs (tests/fixtures/nvcc)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from probes import cuda
from probes.common import ParseError, ProbeFailure, Unavailable
from reconcile import private_cache
from reconcile.spec.models import Spec

NVCC_FIXTURES = Path(__file__).parent / "fixtures" / "nvcc"
REFERENCE_HEADERS = ["cublasLt.h", "curand_kernel.h", "nvrtc.h", "cusparse.h"]


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "xdg-cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache


def make_toolkit(
    root: Path, release: str = "12.8", headers: tuple[str, ...] = (), delay: float = 0.0
) -> Path:
    """<root>/cuda-<release> with bin/nvcc (a script printing the recorded outputs, logging each call to
    <root>/nvcc-calls), include/<headers>, and targets/x86_64-linux/include -> ../../include."""
    toolkit = root / f"cuda-{release}"
    (toolkit / "bin").mkdir(parents=True)
    nvcc = toolkit / "bin" / "nvcc"
    nvcc.write_text(
        "#!/bin/sh\n"
        f'echo "$1" >> {root / "nvcc-calls"}\n'
        f"sleep {delay}\n"
        'case "$1" in\n'
        f"  --version) cat {NVCC_FIXTURES / f'{release}-version.txt'} ;;\n"
        f"  --list-gpu-arch) cat {NVCC_FIXTURES / f'{release}-list-gpu-arch.txt'} ;;\n"
        "  *) echo \"nvcc fatal   : Unknown option '$1'\" >&2; exit 1 ;;\n"
        "esac\n"
    )
    nvcc.chmod(0o755)
    (toolkit / "include").mkdir()
    for name in headers:
        (toolkit / "include" / name).write_text("/* header */\n")
    (toolkit / "targets" / "x86_64-linux").mkdir(parents=True)
    os.symlink("../../include", toolkit / "targets" / "x86_64-linux" / "include")
    return toolkit


def calls(root: Path) -> list[str]:
    log = root / "nvcc-calls"
    return log.read_text().split() if log.exists() else []


def spec_for(home: Path | str, headers: list[str] = REFERENCE_HEADERS) -> Spec:
    return Spec.model_validate({"cuda": {"home": str(home), "headers": headers}})


def test_no_cuda_section_probes_nothing() -> None:
    assert cuda.probe(Spec()) is None


@pytest.mark.skipif(not os.path.isdir("/usr/local/cuda-13.0"), reason="needs this machine's CUDA 13.0")
def test_this_machines_cuda_13_has_nvcc_but_none_of_the_jit_headers() -> None:
    result = cuda.probe(spec_for("/usr/local/cuda", [*REFERENCE_HEADERS, "cuda_runtime.h"]))
    assert result is not None
    assert result.home == cuda.CudaHome(
        "/usr/local/cuda", "symlink", "/usr/local/cuda-13.0", "/usr/local/cuda-13.0"
    )
    nvcc = result.nvcc
    assert isinstance(nvcc, cuda.Nvcc), nvcc
    assert (nvcc.path, nvcc.found_via, nvcc.release, nvcc.version) == (
        "/usr/local/cuda/bin/nvcc",
        "cuda_home",
        "13.0",
        "13.0.88",
    )
    assert "compute_120" in nvcc.gpu_archs and "compute_90" in nvcc.gpu_archs
    assert result.missing_headers == tuple(REFERENCE_HEADERS)
    # include/ and targets/x86_64-linux/include are one directory: the header is listed once.
    assert result.headers[-1].paths == ("/usr/local/cuda-13.0/include/cuda_runtime.h",)


def test_fake_12_8_toolkit_behind_a_symlink(tmp_path: Path) -> None:
    toolkit = make_toolkit(tmp_path, "12.8", headers=("cublasLt.h", "nvrtc.h"))
    sbsa = toolkit / "targets" / "sbsa-linux" / "include"
    sbsa.mkdir(parents=True)
    (sbsa / "nvrtc.h").write_text("/* another copy */\n")
    os.symlink(toolkit, tmp_path / "cuda")
    result = cuda.probe(spec_for(tmp_path / "cuda"))
    assert result is not None
    assert result.home == cuda.CudaHome(str(tmp_path / "cuda"), "symlink", str(toolkit), str(toolkit))
    assert isinstance(result.nvcc, cuda.Nvcc)
    assert (result.nvcc.release, result.nvcc.version) == ("12.8", "12.8.93")
    assert result.nvcc.gpu_archs[0] == "compute_50" and result.nvcc.gpu_archs[-1] == "compute_120"
    assert "compute_121" not in result.nvcc.gpu_archs
    by_name = {h.name: h.paths for h in result.headers}
    assert by_name["cublasLt.h"] == (str(toolkit / "include" / "cublasLt.h"),)
    assert by_name["nvrtc.h"] == (str(toolkit / "include" / "nvrtc.h"), str(sbsa / "nvrtc.h"))
    assert result.missing_headers == ("curand_kernel.h", "cusparse.h")


def test_nvcc_answers_are_cached_per_binary_and_refreshed_when_it_changes(
    tmp_path: Path, _own_cache: Path
) -> None:
    toolkit = make_toolkit(tmp_path, "12.8")
    spec = spec_for(toolkit)
    first = cuda.probe(spec)
    assert first is not None and isinstance(first.nvcc, cuda.Nvcc) and not first.nvcc.from_cache
    assert sorted(calls(tmp_path)) == ["--list-gpu-arch", "--version"]
    entry = private_cache.read(str(_own_cache / "reconcile" / "nvcc.marshal"))[str(toolkit / "bin" / "nvcc")]
    assert entry["inode"] == (toolkit / "bin" / "nvcc").stat().st_ino

    second = cuda.probe(spec)
    assert second is not None and isinstance(second.nvcc, cuda.Nvcc) and second.nvcc.from_cache
    assert len(calls(tmp_path)) == 2, "a cache hit must not start nvcc"
    assert (second.nvcc.release, second.nvcc.gpu_archs) == (first.nvcc.release, first.nvcc.gpu_archs)

    # An upgrade replaces the binary: new size/inode/mtime, so nvcc is asked again.
    nvcc = toolkit / "bin" / "nvcc"
    new = nvcc.read_text().replace("12.8-", "13.0-")
    nvcc.unlink()
    nvcc.write_text(new)
    nvcc.chmod(0o755)
    third = cuda.probe(spec)
    assert third is not None and isinstance(third.nvcc, cuda.Nvcc)
    assert (third.nvcc.release, third.nvcc.from_cache) == ("13.0", False)
    assert "compute_121" in third.nvcc.gpu_archs
    assert len(calls(tmp_path)) == 4


def test_damaged_cache_is_a_miss_and_is_rewritten(tmp_path: Path, _own_cache: Path) -> None:
    toolkit = make_toolkit(tmp_path, "13.0")
    (_own_cache / "reconcile").mkdir(parents=True, mode=0o700)
    damaged = _own_cache / "reconcile" / "nvcc.marshal"
    damaged.write_bytes(b"{not marshal")
    damaged.chmod(0o600)
    result = cuda.probe(spec_for(toolkit))
    assert result is not None and isinstance(result.nvcc, cuda.Nvcc)
    assert result.nvcc.release == "13.0"
    assert str(toolkit / "bin" / "nvcc") in private_cache.read(str(damaged))


def test_unwritable_cache_location_does_not_fail_the_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "below-a-file"))
    result = cuda.probe(spec_for(make_toolkit(tmp_path, "13.0")))
    assert result is not None and isinstance(result.nvcc, cuda.Nvcc)
    assert result.nvcc.version == "13.0.88"


def test_the_two_nvcc_calls_run_at_the_same_time(tmp_path: Path) -> None:
    toolkit = make_toolkit(tmp_path, "13.0", delay=0.5)
    started = time.monotonic()
    result = cuda.probe(spec_for(toolkit))
    elapsed = time.monotonic() - started
    assert result is not None and isinstance(result.nvcc, cuda.Nvcc)
    assert elapsed < 0.9, f"two 0.5 s nvcc calls took {elapsed:.2f} s: they ran one after the other"


def test_nvcc_missing_from_home_is_looked_up_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    toolkit = make_toolkit(tmp_path, "13.0")
    home = tmp_path / "home-without-nvcc"
    (home / "include").mkdir(parents=True)
    monkeypatch.setenv("PATH", f"{toolkit / 'bin'}:/usr/bin:/bin")
    result = cuda.probe(spec_for(home))
    assert result is not None and result.home.state == "directory"
    assert isinstance(result.nvcc, cuda.Nvcc)
    assert (result.nvcc.path, result.nvcc.found_via) == (str(toolkit / "bin" / "nvcc"), "PATH")
    assert result.nvcc.why == f"{home}/bin/nvcc is absent; found on PATH at {toolkit}/bin/nvcc"


def test_no_nvcc_anywhere_is_unavailable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    result = cuda.probe(spec_for(tmp_path / "no-such-cuda"))
    assert result is not None
    assert result.home == cuda.CudaHome(str(tmp_path / "no-such-cuda"), "absent", None, None)
    assert isinstance(result.nvcc, Unavailable)
    assert "no nvcc is on PATH" in result.nvcc.reason
    assert result.missing_headers == tuple(REFERENCE_HEADERS)


def test_dangling_symlink_and_a_plain_file_as_home(tmp_path: Path) -> None:
    os.symlink(tmp_path / "cuda-12.4", tmp_path / "cuda")
    assert cuda.read_home(str(tmp_path / "cuda")) == cuda.CudaHome(
        str(tmp_path / "cuda"), "symlink", str(tmp_path / "cuda-12.4"), None
    )
    (tmp_path / "file").write_text("")
    assert cuda.read_home(str(tmp_path / "file")).state == "other"


def test_nvcc_that_fails_is_a_failure_with_its_output(tmp_path: Path) -> None:
    toolkit = make_toolkit(tmp_path, "13.0")
    (toolkit / "bin" / "nvcc").write_text("#!/bin/sh\necho 'nvcc fatal   : cannot find cicc' >&2\nexit 1\n")
    result = cuda.probe(spec_for(toolkit))
    assert result is not None and isinstance(result.nvcc, ProbeFailure)
    assert "exited 1" in result.nvcc.reason
    assert "cannot find cicc" in result.nvcc.raw


def test_nvcc_printing_something_else_is_a_failure_with_the_text(tmp_path: Path) -> None:
    toolkit = make_toolkit(tmp_path, "13.0")
    (toolkit / "bin" / "nvcc").write_text("#!/bin/sh\necho 'clang version 18.1.3'\n")
    result = cuda.probe(spec_for(toolkit))
    assert result is not None and isinstance(result.nvcc, ProbeFailure)
    assert "clang version 18.1.3" in result.nvcc.raw


def test_parsers_on_recorded_outputs() -> None:
    assert cuda.parse_nvcc_version((NVCC_FIXTURES / "13.0-version.txt").read_text()) == ("13.0", "13.0.88")
    assert cuda.parse_nvcc_version((NVCC_FIXTURES / "12.8-version.txt").read_text()) == ("12.8", "12.8.93")
    archs = cuda.parse_gpu_arch_list((NVCC_FIXTURES / "13.0-list-gpu-arch.txt").read_text())
    assert archs == (
        "compute_75",
        "compute_80",
        "compute_86",
        "compute_87",
        "compute_88",
        "compute_89",
        "compute_90",
        "compute_100",
        "compute_110",
        "compute_103",
        "compute_120",
        "compute_121",
    )
    assert len(cuda.parse_gpu_arch_list((NVCC_FIXTURES / "12.8-list-gpu-arch.txt").read_text())) == 17


def test_empty_arch_list_is_empty_not_an_error() -> None:
    # Gotcha 4 of the reference article: an nvcc that lists nothing makes FlashInfer's arch list empty.
    assert cuda.parse_gpu_arch_list("") == ()


def test_arch_list_with_garbage_is_an_error() -> None:
    with pytest.raises(ParseError) as err:
        cuda.parse_gpu_arch_list("compute_90\nnvcc warning : something\n")
    assert "nvcc warning" in err.value.raw
