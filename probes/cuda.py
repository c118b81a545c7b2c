"""CUDA toolkit probe: the CUDA_HOME symlink, nvcc (version and arch list) and the dev headers.

Called by reconcile.plan.prober. nvcc's two answers are cached in $XDG_CACHE_HOME/reconcile/nvcc.json,
keyed by the binary's (realpath, size, mtime_ns, inode): starting nvcc costs more than the rest.
"""

from __future__ import annotations

import os
import re
import shutil
import stat

from probes.common import ParseError, ProbeFailure, Unavailable
from reconcile import host
from reconcile.record import Record
from reconcile.threads import run_all

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Literal

    HomeState = Literal["symlink", "directory", "absent", "other"]

    from reconcile.spec.models import Spec

NVCC_TIMEOUT = 30.0


class CudaHome(Record):
    path: str
    state: HomeState
    link_target: str | None  # readlink(path) when a symlink
    resolved: str | None  # realpath(path) when it (or what it points to) exists
    # A symlink whose target is missing: state "symlink", resolved None.


class Nvcc(Record):
    path: str
    found_via: Literal["cuda_home", "PATH"]
    why: str  # e.g. "/usr/local/cuda/bin/nvcc is absent; found on PATH"
    release: str  # "13.0"
    version: str  # "13.0.88"
    gpu_archs: tuple[str, ...]  # ("compute_75", ..., "compute_121"), nvcc's order
    from_cache: bool


class Header(Record):
    name: str
    paths: tuple[str, ...]  # every include dir holding it (distinct real files); empty: missing

    @property
    def found(self) -> bool:
        return bool(self.paths)


class CudaToolkit(Record):
    home: CudaHome
    nvcc: Nvcc | Unavailable | ProbeFailure
    headers: tuple[Header, ...]

    @property
    def missing_headers(self) -> tuple[str, ...]:
        return tuple(h.name for h in self.headers if not h.found)


def probe(spec: Spec) -> CudaToolkit | None:
    if spec.cuda is None:
        return None
    home = read_home(spec.cuda.home)
    return CudaToolkit(
        home=home,
        nvcc=find_and_query_nvcc(home),
        headers=find_headers(home.resolved, spec.cuda.headers),
    )


def read_home(path: str) -> CudaHome:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return CudaHome(path, "absent", None, None)
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(path)
        resolved = os.path.realpath(path)
        return CudaHome(path, "symlink", target, resolved if os.path.exists(resolved) else None)
    if stat.S_ISDIR(st.st_mode):
        return CudaHome(path, "directory", None, os.path.realpath(path))
    return CudaHome(path, "other", None, None)


def find_and_query_nvcc(home: CudaHome) -> Nvcc | Unavailable | ProbeFailure:
    in_home = os.path.join(home.path, "bin", "nvcc")
    via: Literal["cuda_home", "PATH"]
    if os.access(in_home, os.X_OK) and os.path.isfile(in_home):
        path, via, why = in_home, "cuda_home", f"found at {in_home}"
    else:
        problem = "is not an executable file" if os.path.lexists(in_home) else "is absent"
        on_path = shutil.which("nvcc")
        if on_path is None:
            return Unavailable(f"nvcc not found: {in_home} {problem} and no nvcc is on PATH")
        path, via, why = on_path, "PATH", f"{in_home} {problem}; found on PATH at {on_path}"
    from reconcile.safety.filesafety import UnsafePath, resolve_exec

    try:  # every plan runs it as root: the exec role, as for [server] executable
        real = resolve_exec(path, what="nvcc")  # run by its walked real path; shown as found
    except UnsafePath as exc:
        return ProbeFailure(f"{path}: not run: {exc}")
    outputs = query_nvcc(real)
    if isinstance(outputs, ProbeFailure):
        return outputs
    version_text, arch_text, cached = outputs
    try:
        release, version = parse_nvcc_version(version_text)
        archs = parse_gpu_arch_list(arch_text)
    except ParseError as exc:
        return exc.as_failure(f"{path}: unexpected output")
    return Nvcc(path, via, why, release, version, archs, cached)


def query_nvcc(path: str) -> tuple[str, str, bool] | ProbeFailure:
    """(`--version` stdout, `--list-gpu-arch` stdout, from_cache): the cache, else both commands at once."""
    key = _cache_key(path)
    hit = _cache_lookup(key)
    if hit is not None:
        return hit[0], hit[1], True
    try:
        answers = run_all(
            {
                "version": lambda: host.run([path, "--version"], timeout=NVCC_TIMEOUT),
                "arch": lambda: host.run([path, "--list-gpu-arch"], timeout=NVCC_TIMEOUT),
            },
            "nvcc",
        )
    except (host.ToolMissing, host.CommandTimeout) as exc:
        return ProbeFailure(f"{path}: {exc}")
    version, arch = answers["version"], answers["arch"]
    for done in (version, arch):
        if not done.ok:
            return ProbeFailure(
                f"`{' '.join(done.argv)}` exited {done.returncode}", raw=done.stdout + done.stderr
            )
    _cache_store(key, version.stdout, arch.stdout)
    return version.stdout, arch.stdout, False


def cache_file() -> str:
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # the XDG spec says to ignore a relative value
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "reconcile", "nvcc.marshal")


def _cache_key(path: str) -> dict[str, object] | None:
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError:
        return None
    return {"realpath": real, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}


def _cache_read() -> dict[str, dict[str, object]]:
    # A missing or damaged cache is a miss: nvcc is asked again and the answer rewrites it. Read by the
    # per-user cache's rules (reconcile.private_cache): a regular 0600 file of ours in a 0700 directory
    # of ours, opened non-blocking (a FIFO there is a miss, never a hang), never another user's answers
    # (root run with their XDG_CACHE_HOME).
    from reconcile import private_cache

    entries = private_cache.read(cache_file())
    return entries if isinstance(entries, dict) else {}


def _cache_lookup(key: dict[str, object] | None) -> tuple[str, str] | None:
    if key is None:
        return None
    entry = _cache_read().get(str(key["realpath"]))
    if not isinstance(entry, dict) or any(entry.get(k) != v for k, v in key.items()):
        return None
    version, archs = entry.get("version_output"), entry.get("arch_output")
    if isinstance(version, str) and isinstance(archs, str):
        return version, archs
    return None


def _cache_store(key: dict[str, object] | None, version: str, archs: str) -> None:
    if key is None:
        return
    entries = _cache_read()
    entries[str(key["realpath"])] = {**key, "version_output": version, "arch_output": archs}
    from reconcile import private_cache

    private_cache.write(cache_file(), entries)  # only saves time: a foreign or read-only home costs that


_RELEASE = re.compile(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)")
_ARCH = re.compile(r"compute_\d+[a-z]?")


def parse_nvcc_version(text: str) -> tuple[str, str]:
    """`nvcc --version` -> ("13.0", "13.0.88") from "Cuda compilation tools, release 13.0, V13.0.88"."""
    m = _RELEASE.search(text)
    if m is None:
        raise ParseError("no 'release X.Y, VX.Y.Z' line in nvcc --version output", raw=text)
    return m.group(1), m.group(2)


def parse_gpu_arch_list(text: str) -> tuple[str, ...]:
    """`nvcc --list-gpu-arch` -> ("compute_75", ...). Empty output is an empty list (gotcha 4)."""
    archs = text.split()
    bad = [a for a in archs if not _ARCH.fullmatch(a)]
    if bad:
        raise ParseError(f"not a compute_XY entry: {bad[0]!r}", raw=text)
    return tuple(archs)


def include_dirs(resolved_home: str) -> list[str]:
    import glob  # only here: when headers are looked for, not on every import of the probe

    dirs = [os.path.join(resolved_home, "include")]
    dirs += sorted(glob.glob(os.path.join(glob.escape(resolved_home), "targets", "*", "include")))
    return [d for d in dirs if os.path.isdir(d)]


def find_headers(resolved_home: str | None, names: list[str]) -> tuple[Header, ...]:
    dirs = include_dirs(resolved_home) if resolved_home else []
    headers = []
    for name in names:
        seen: set[str] = set()
        paths = []
        for d in dirs:
            candidate = os.path.join(d, name)
            if os.path.isfile(candidate):
                # The toolkit links include/ and targets/<arch>/include to each other: one file, two names.
                real = os.path.realpath(candidate)
                if real not in seen:
                    seen.add(real)
                    paths.append(candidate)
        headers.append(Header(name, tuple(paths)))
    return tuple(headers)
