"""The vLLM start-up failures of the reference article, recognised in log lines, with their fixes.

`diagnose()` serves the server lifecycle when /health never turns 200; the fix helpers (headers ->
apt packages, CUDA per arch, removed flags) are the preflight's too, so both name the same fix.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache

from reconcile.record import Record
from reconcile.safety.untrusted import load_json
from reconcile.vllm.flags import canonical
from reconcile.vllm.toolchain import cuda_suffix, header_package

# header_package stays importable from here: reconcile.plan.planner uses it for its apt hint.
__all__ = ["Diagnosis", "cuda_suffix", "diagnose", "header_package", "removed_flag_fix"]


def _toml(value: object) -> str:
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


def rope_parameters_from(flag: str, value: object) -> dict[str, object] | None:
    """What a --rope-scaling / --rope-theta value becomes inside config.json's rope_parameters."""
    if canonical(flag) == "--rope-theta" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return {"rope_theta": value}
    if isinstance(value, str):
        try:
            value = load_json(value)
        except ValueError:
            return None
    if not isinstance(value, Mapping):
        return None
    params = dict(value)
    if "type" in params and "rope_type" not in params:
        params["rope_type"] = params.pop("type")
    return params


def removed_flag_fix(flag: str, value: object = None) -> str:
    """The spec edit that replaces a flag vLLM removed."""
    name = canonical(flag)
    if name in ("--rope-scaling", "--rope-theta"):
        params = rope_parameters_from(name, value)
        shown = _toml(params) if params else "{ rope_type = ..., factor = ..., ... }"
        return (
            f"drop args.{name[2:]}; put it in config.json instead: [model] config = {{ rope_parameters = "
            f"{shown} }} (apply patches config.json, keeping config.json.bak), or pass "
            f"args.hf-overrides = '{json.dumps({'rope_parameters': params or {}})}'"
        )
    if name == "--swap-space":
        return "drop args.swap-space: vLLM 0.18.0 removed the CPU swap space (nothing replaces it)"
    return f"drop args.{name[2:]}"


class Diagnosis(Record):
    """One log line that matches a known failure: which one, why it happens, and the fix."""

    line: str
    failure_id: str  # the preflight rule that should have caught it ("toolchain.headers", ...)
    explanation: str
    fix: str


Fix = Callable[["re.Match[str]", "str | None"], tuple[str, str]]


def _unrecognized(m: re.Match[str], _cuda: str | None) -> tuple[str, str]:
    flags = re.findall(r"--?[A-Za-z][\w-]*", m.group(1))
    return (
        f"this vLLM's argument parser has no {', '.join(flags) or 'such flag'}",
        "; ".join(removed_flag_fix(f) for f in flags) or "drop the flag from args",
    )


def _max_len(m: re.Match[str], _cuda: str | None) -> tuple[str, str]:
    requested, key, derived = int(m.group(1)), m.group(2), int(float(m.group(3)))
    return (
        f"max-model-len {requested:,} is above the {derived:,} vLLM derives from config.json ({key})",
        f"set args.max-model-len = {derived} exactly; or extend the context with rope_parameters (yarn) in "
        '[model] config; or set env VLLM_ALLOW_LONG_MAX_MODEL_LEN = "1" (risk: RoPE positions past '
        f"{derived:,} produce NaN)",
    )


def _nvcc_missing(_m: re.Match[str], cuda: str | None) -> tuple[str, str]:
    return (
        "FlashInfer's JIT needs nvcc at $CUDA_HOME/bin/nvcc (then PATH, then /usr/local/cuda)",
        f"install cuda-nvcc-{cuda_suffix(cuda) or '13-0'} ([apt] packages), point [cuda] home at the "
        "toolkit, and keep $CUDA_HOME/bin on the server's PATH (the launcher does unless [server] env "
        "overrides PATH)",
    )


def _nvcc_old(_m: re.Match[str], _cuda: str | None) -> tuple[str, str]:
    return (
        "the nvcc under CUDA_HOME is older than 12.9 and cannot build sm_120 (Blackwell) kernels",
        "install cuda-nvcc-13-0 and its dev headers, and point [cuda] home at /usr/local/cuda-13.0 "
        '([cuda] target = "/usr/local/cuda-13.0"; apply re-points the symlink)',
    )


def _arch(_m: re.Match[str], _cuda: str | None) -> tuple[str, str]:
    return (
        "misleading: FlashInfer's list of target archs is empty because `nvcc --list-gpu-arch` does not "
        "print the GPU's compute_XY (nvcc too old, or not the one under CUDA_HOME); the GPU itself is fine",
        "install an nvcc that lists the GPU's arch (CUDA >= 12.9 for sm_120) and point [cuda] home at it; "
        '[cuda] gpu_arch = ["compute_120"] makes the plan check it',
    )


def _ninja(_m: re.Match[str], _cuda: str | None) -> tuple[str, str]:
    return (
        "the worker processes spawn `ninja` for the JIT build and do not find it on their PATH",
        'add ninja = "*" to [venv] packages, and keep <venv>/bin first on the server\'s PATH',
    )


def _header(m: re.Match[str], cuda: str | None) -> tuple[str, str]:
    header = m.group(1)
    package = header_package(header, cuda)
    if package is None:
        return f"{header} is missing from the CUDA toolkit's include dirs", f"apt-file search {header}"
    return (
        f"{header} is missing from the CUDA toolkit's include dirs; FlashInfer's JIT compiles against it",
        f"add {package} to [apt] packages (apt-get install {package})"
        + ("" if cuda else "; X-Y is the toolkit's version, e.g. 13-0"),
    )


def _free(m: re.Match[str], _cuda: str | None) -> tuple[str, str]:
    device = m.group(1) or "the GPU"
    free, total, util = float(m.group(2)), float(m.group(3)), float(m.group(4))
    fits = int((free / total) * 100 - 1) / 100 if total else 0.0
    return (
        f"{total - free:.2f} GiB of {device} was held by other processes when vLLM started (often a dead "
        'server\'s EngineCore/Worker_TP children, which `pkill -f "vllm serve"` misses)',
        "list holders with `nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv`; "
        "`reconcile apply` stops strays of its own deployment; stop other holders yourself, or lower "
        f"args.gpu-memory-utilization from {util:g} to {fits:.2f} or less",
    )


def _kv(m: re.Match[str], _cuda: str | None) -> tuple[str, str]:
    seq, need, have, estimate = m.group(1), m.group(2), m.group(3), m.group(4)
    hint = "lower args.max-model-len, "
    if estimate:
        hint = f"set args.max-model-len <= {estimate} (vLLM's estimate), "
    return (
        f"one request of {int(seq):,} tokens needs {need} GiB of KV cache; only {have} GiB is left after "
        "weights and activations",
        hint + 'or raise args.gpu-memory-utilization, use args.kv-cache-dtype = "fp8", or add GPUs '
        "(tensor-parallel-size)",
    )


def _no_cache(_m: re.Match[str], _cuda: str | None) -> tuple[str, str]:
    return (
        "nothing is left for the KV cache after the weights and activations",
        "raise args.gpu-memory-utilization, add GPUs (tensor-parallel-size), or lower max-num-batched-tokens",
    )


def _reasoning(m: re.Match[str], _cuda: str | None) -> tuple[str, str]:
    name = m.group(1)
    return (
        f"no reasoning parser named {name!r} is registered: it is neither built in nor loaded from a plugin",
        f'set args.reasoning-parser-plugin = "<model dir>/{name}_reasoning_parser.py" (the file the model '
        "ships) and list that file in [model] required_files",
    )


def _plugin_load(m: re.Match[str], _cuda: str | None) -> tuple[str, str]:
    return (
        f"the parser plugin {m.group(1)} could not be imported, so its parser never registers",
        "check that the file is in the model dir (absolute path in args) and imports with the venv's Python",
    )


def _tool(m: re.Match[str], _cuda: str | None) -> tuple[str, str]:
    return (
        f"no tool-call parser named {m.group(1)!r} in this vLLM",
        'use a built-in name (e.g. "hermes"), or add args.tool-parser-plugin with the file registering it',
    )


def _port(_m: re.Match[str], _cuda: str | None) -> tuple[str, str]:
    return (
        "another process already listens on the server's port",
        "find it with `ss -ltnp`; stop it or change [server] port",
    )


# (failure id, regex, fix); compiled on first use so that importing this module stays cheap.
_PATTERNS: tuple[tuple[str, str, Fix], ...] = (
    ("flags.removed", r"error: unrecognized arguments: (.+)$", _unrecognized),
    (
        "max-model-len.derived",
        (
            r"User-specified max_model_len \((\d+)\) is greater than the derived max_model_len "
            r"\((\w+)=([\d.]+)"
        ),
        _max_len,
    ),
    ("toolchain.nvcc", r"SM 12\.x requires CUDA >= 12\.9", _nvcc_old),
    ("toolchain.arch", r"FlashInfer requires GPUs with sm75 or higher", _arch),
    ("model.plugin", r"Failed to load module '?([^' ]+)'? from ", _plugin_load),
    ("model.plugin", r"No such file or directory: '([^']*_parser[^']*\.py)'", _plugin_load),
    (
        "toolchain.nvcc",
        (
            r"Could not find nvcc|cuda_home='[^']*' doesn't exist|nvcc: (?:command )?not found|"
            r"No such file or directory: '[^']*nvcc'|CUDA_HOME environment variable is not set"
        ),
        _nvcc_missing,
    ),
    (
        "toolchain.ninja",
        (
            r"'ninja' not found|Ninja is required to load C\+\+ extensions|"
            r"No such file or directory: 'ninja'|ninja: (?:command )?not found"
        ),
        _ninja,
    ),
    ("toolchain.headers", r"fatal error: ([\w/.+-]+): No such file or directory", _header),
    (
        "host.gpu-free",
        (
            r"Free memory on device ?(cuda:\d+)? \(([\d.]+)/([\d.]+) GiB\) on startup is less than desired "
            r"GPU memory utilization \(([\d.]+)"
        ),
        _free,
    ),
    (
        "memory.fit",
        (
            r"To serve at least one request with the models?'s? max seq len \((\d+)\),? \(?([\d.]+) GiB KV "
            r"cache\)? is needed, which is larger than the available KV cache memory \(([\d.]+) GiB\)"
            r"(?:.*estimated maximum model length is (\d+))?"
        ),
        _kv,
    ),
    ("memory.fit", r"No available memory for the cache blocks", _no_cache),
    ("model.plugin", r"[Ii]nvalid reasoning parser: ([\w.-]+)", _reasoning),
    ("model.parsers", r"invalid tool call parser: ([\w.-]+)", _tool),
    ("host.port", r"\[Errno 98\]|Address already in use", _port),
)


@lru_cache(maxsize=1)
def _compiled() -> tuple[tuple[str, re.Pattern[str], Fix], ...]:
    return tuple((failure_id, re.compile(pattern), fix) for failure_id, pattern, fix in _PATTERNS)


def diagnose(log_lines: Iterable[str], *, cuda_version: str | None = None) -> list[Diagnosis]:
    """The known failures among `log_lines`, first occurrence of each (tracebacks repeat them)."""
    out: list[Diagnosis] = []
    seen: set[tuple[str, str]] = set()
    for raw in log_lines:
        line = raw.rstrip("\n")
        for failure_id, pattern, fix in _compiled():
            m = pattern.search(line)
            if not m:
                continue
            explanation, remedy = fix(m, cuda_version)
            if (failure_id, remedy) not in seen:
                seen.add((failure_id, remedy))
                out.append(Diagnosis(line.strip(), failure_id, explanation, remedy))
            break
    return out
