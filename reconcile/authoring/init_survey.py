"""`reconcile init`: probe this machine and write a starting spec, like `nixos-generate-config`.

Called by the CLI. Read only, apart from the spec it writes. What it finds (GPUs, driver, CUDA,
the toolkit's apt packages, a venv with vLLM) becomes live sections that plan as converged; a
running vLLM that reconcile did not start becomes a commented block, since managing it restarts it.
"""

from __future__ import annotations

import glob
import os
import re
import socket
import time
from typing import Any

from reconcile.errors import ReconcileError
from reconcile.host import CommandTimeout, ToolMissing, atomic_write, run
from reconcile.record import Record
from reconcile.safety.sensitive import has_credentials, is_secret_name, secret_args
from reconcile.safety.untrusted import load_json

VENV_GLOBS = (
    "/opt/*/bin/vllm",
    "/opt/*/*/bin/vllm",
    "/root/*/bin/vllm",
    "/root/.*/bin/vllm",
    "/home/*/*/bin/vllm",
    "/home/*/.*/bin/vllm",
    "/srv/*/bin/vllm",
    "/usr/local/*/bin/vllm",
)
# FlashInfer's JIT headers, from the reference article; only those found are written.
HEADERS = ("cublasLt.h", "curand_kernel.h", "nvrtc.h", "cusparse.h")
_CUDA_PACKAGE = re.compile(
    r"^(cuda-[a-z0-9-]+|lib(cublas|curand|cusparse|cusolver|cufft|nvjitlink|nvrtc|npp[a-z]*|nvjpeg|cufile)"
    r"-dev)-\d+-\d+\Z"
)
_ENV_KEPT = (
    "VLLM_",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "CUDA_VISIBLE_DEVICES",
    "NCCL_",
    "PYTORCH_CUDA_ALLOC_CONF",
    "TOKENIZERS_PARALLELISM",
    "OMP_NUM_THREADS",
)
HELPERS = ("ninja", "huggingface_hub", "flashinfer-python")


class FoundServer(Record):
    """A running `vllm serve` as /proc shows it. Never holds the key: --api-key is dropped."""

    pid: int
    argv: tuple[str, ...]  # --api-key's value shown as (sensitive)
    venv: str | None
    model: str | None
    args: dict[str, Any]  # flags without dashes, host/port/served-model-name included
    env: dict[str, str]  # the non-secret VLLM_*/HF_* variables of its environment
    key_on_cmdline: bool
    key_in_env: bool
    log: str | None
    secret_flags: tuple[str, ...] = ()  # left out of args: a secret was in their value (safety.sensitive)


class MachineFacts(Record):
    hostname: str
    gpu: Any  # probes.gpu: GpuInventory | Unavailable | ProbeFailure
    cuda_home: Any  # probes.cuda.CudaHome
    nvcc: Any  # probes.cuda: Nvcc | Unavailable | ProbeFailure
    headers: tuple[Any, ...]  # probes.cuda.Header
    cuda_packages: dict[str, str]  # installed toolkit packages -> version
    venv: Any  # probes.venv.VenvObservation | None
    venv_how: str
    other_venvs: tuple[str, ...] = ()
    server: FoundServer | None = None
    notes: tuple[str, ...] = ()


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _is_venv(path: str | None) -> bool:
    return bool(path) and os.path.isfile(os.path.join(str(path), "pyvenv.cfg"))


def _value(text: str) -> Any:
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if re.fullmatch(r"-?\d+\.\d*(e-?\d+)?|-?\d+e-?\d+", text):
        return float(text)
    if text.startswith("{"):
        try:
            data = load_json(text)
            if isinstance(data, dict):
                return data
        except ValueError:
            pass
    return text


def parse_serve_args(tokens: list[str]) -> tuple[str | None, dict[str, Any], bool]:
    """`serve`'s arguments -> (model, flags, whether --api-key was given); the key's value is dropped."""
    model = tokens[0] if tokens and not tokens[0].startswith("-") else None
    args: dict[str, Any] = {}
    key = False
    i = 1 if model else 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--"):
            i += 1
            continue
        name, eq, inline = token[2:].partition("=")
        values = [inline] if eq else []
        i += 1
        while not eq and i < len(tokens) and not tokens[i].startswith("--"):
            values.append(tokens[i])
            i += 1
        if name == "api-key":
            key = True
        elif not values:
            args[name[3:] if name.startswith("no-") else name] = not name.startswith("no-")
        else:
            args[name] = _value(values[0]) if len(values) == 1 else [_value(v) for v in values]
    if model is None and isinstance(args.get("model"), str):
        model = args.pop("model")
    return model, args, key


def _environ(pid: int, proc: str) -> dict[str, str]:
    out = {}
    for item in _read(f"{proc}/{pid}/environ").split(b"\0"):
        k, eq, v = item.decode(errors="replace").partition("=")
        if eq:
            out[k] = v
    return out


def _trusted(venv: str) -> bool:
    """A venv root may run: it and every directory above it root's or ours, writable by nobody else
    (the path rule's write-dir role, as the drafted [venv] path will be held to)."""
    from reconcile.safety.filesafety import parent_problem

    return parent_problem(venv, follow=True, is_dir=True) is None


def _ours(pid: int, proc: str) -> bool:
    """Whether root or the user running init runs `pid` (real and effective uid, /proc/PID/status):
    another user's process says nothing about what root should run, whatever its command line."""
    from reconcile.safety.filesafety import owners

    for line in _read(f"{proc}/{pid}/status").splitlines():
        if line.startswith(b"Uid:"):
            parts = line.split()
            return len(parts) >= 3 and {int(parts[1]), int(parts[2])} <= owners()
    return False


def _server_at(pid: int, proc: str) -> tuple[int, FoundServer] | None:
    """(parent pid, server) when /proc/PID runs `vllm serve` (or vLLM's api_server module)."""
    from reconcile.identity import redact_argv

    if not _ours(pid, proc):
        return None
    tokens = [t for t in _read(f"{proc}/{pid}/cmdline").decode(errors="replace").split("\0") if t]
    at = next(
        (i for i, t in enumerate(tokens[:-1]) if os.path.basename(t) == "vllm" and tokens[i + 1] == "serve"),
        None,
    )
    if at is not None:
        rest, vllm = tokens[at + 2 :], tokens[at]
    elif "vllm.entrypoints.openai.api_server" in tokens:
        rest, vllm = tokens[tokens.index("vllm.entrypoints.openai.api_server") + 1 :], ""
    else:
        return None
    stat = _read(f"{proc}/{pid}/stat").rpartition(b")")[2].split()
    ppid = int(stat[1]) if len(stat) > 1 else 0
    env = _environ(pid, proc)
    try:
        exe = os.readlink(f"{proc}/{pid}/exe")
    except OSError:
        exe = ""
    guesses = [os.path.dirname(os.path.dirname(p)) for p in (vllm, tokens[0], exe) if p.startswith("/")]
    venv = next((g for g in [*guesses[:2], env.get("VIRTUAL_ENV", ""), *guesses[2:]] if _is_venv(g)), None)
    model, args, key = parse_serve_args(rest)
    secret = tuple(sorted({path[0] for path in secret_args(args)}))  # the spec would refuse them
    try:
        out = os.readlink(f"{proc}/{pid}/fd/1")
    except OSError:
        out = ""
    kept = {
        k: v
        for k, v in env.items()
        if k.startswith(_ENV_KEPT) and not is_secret_name(k) and not has_credentials(v)
    }
    return ppid, FoundServer(
        pid,
        tuple(redact_argv(tokens)),
        venv,
        model,
        {k: v for k, v in args.items() if k not in secret},
        dict(sorted(kept.items())),
        key,
        "VLLM_API_KEY" in env,
        out if out.startswith("/") and os.path.isfile(out) else None,
        secret,
    )


def find_servers(proc: str = "/proc") -> list[FoundServer]:
    """Every running vLLM server (not its engine children), those in a venv first."""
    found: dict[int, tuple[int, FoundServer]] = {}
    for entry in os.listdir(proc):
        if entry.isdigit() and int(entry) != os.getpid():
            hit = _server_at(int(entry), proc)
            if hit is not None:
                found[int(entry)] = hit
    tops = [s for ppid, s in found.values() if ppid not in found]
    return sorted(tops, key=lambda s: (s.venv is None, s.pid))


def cuda_packages() -> dict[str, str]:
    """Installed toolkit packages (cuda-*, lib*-dev-X-Y) -> version, from one dpkg-query; only those
    a person asked for (`apt-mark showmanual`) when apt knows that, not what they pulled in."""
    try:
        done = run(
            [
                "dpkg-query",
                "-W",
                "-f=${Package}\\t${db:Status-Abbrev}\\t${Version}\\n",
                "cuda-*",
                "libcu*",
                "libnv*",
                "libnpp*",
            ],
            env={**os.environ, "LC_ALL": "C"},
            timeout=60,
        )
    except (ToolMissing, CommandTimeout):
        return {}
    out = {}
    for line in done.stdout.splitlines():
        name, _, rest = line.partition("\t")
        status, _, version = rest.partition("\t")
        if status.startswith("ii") and _CUDA_PACKAGE.match(name):
            out[name] = version
    try:
        manual = set(run(["apt-mark", "showmanual"], timeout=60).stdout.split())
    except (ToolMissing, CommandTimeout):
        manual = set()
    asked = {n: v for n, v in out.items() if n in manual}
    return dict(sorted((asked or out).items()))


def probe_machine(
    *, venv_globs: tuple[str, ...] = VENV_GLOBS, pid: int | None = None, proc: str = "/proc"
) -> MachineFacts:
    """What this machine has now; every probe is read only."""
    from probes import cuda, gpu
    from probes.venv import VenvObservation, read_venv
    from reconcile.plan.prober import run_guarded
    from reconcile.spec.models import Spec

    inventory = run_guarded("gpu", gpu.probe, Spec())
    home = cuda.read_home("/usr/local/cuda")
    nvcc = cuda.find_and_query_nvcc(home)
    headers = cuda.find_headers(home.resolved, list(HEADERS))
    servers = find_servers(proc)
    if pid is not None:
        hit = _server_at(pid, proc)
        if hit is None:
            raise ReconcileError(
                f"--pid {pid}: not a running `vllm serve` of root or yours (see `ps -o user=,args= -p {pid}`)"
            )
        servers = [hit[1]]
    server = servers[0] if servers else None
    found = sorted({os.path.dirname(os.path.dirname(p)) for g in venv_globs for p in glob.glob(g)})
    found = [v for v in found if _is_venv(v) and _trusted(v)]
    if server is not None and server.venv and _trusted(server.venv):
        path, how = server.venv, f"the venv of the running server (pid {server.pid})"
    elif found:
        path, how = found[0], f"found at {found[0]}/bin/vllm"
    else:
        path, how = None, "no venv with bin/vllm found (looked in " + ", ".join(venv_globs) + ")"
    seen = read_venv(path) if path else None
    venv = seen if isinstance(seen, VenvObservation) else None
    others = tuple(v for v in found if v != path)
    notes = tuple(f"another vLLM server runs: pid {s.pid} ({' '.join(s.argv)[:80]})" for s in servers[1:])
    return MachineFacts(
        socket.gethostname(),
        inventory,
        home,
        nvcc,
        headers,
        cuda_packages(),
        venv,
        how,
        others,
        server,
        notes,
    )


def default_path(hostname: str, specs_dir: str = "specs") -> str:
    return os.path.join(specs_dir, f"{hostname}.toml")


def write_spec(path: str, text: str, *, force: bool) -> None:
    if os.path.exists(path) and not force:
        raise ReconcileError(
            f"{path} exists: not overwritten (compare with `reconcile init --out -`, or --force)"
        )
    from reconcile.safety.filesafety import ensure_dir

    ensure_dir(os.path.dirname(os.path.abspath(path)), 0o755)
    atomic_write(path, text.encode(), mode=0o644)


def generated_at() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %z")
