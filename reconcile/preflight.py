"""Preflight: the rules that catch, in `plan`, what would otherwise fail minutes into a vLLM boot.

The planner calls `run_preflight(spec, PreflightInputs(...))`. Here: the inputs, the rules' shared
context, the flags and max-model-len rules; the rest in preflight_{memory,toolchain,serving}.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from reconcile.engine import limits
from reconcile.engine.failures import removed_flag_fix
from reconcile.engine.flags import canonical, flag_exists, flag_history, listed_versions, release
from reconcile.plan import Finding, Severity

if TYPE_CHECKING:
    from reconcile.spec import ArgValue, Server, Spec


@dataclass(frozen=True)
class GpuFact:
    index: int
    name: str
    compute_capability: str  # "12.0"
    total_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    gpu_index: int
    used_bytes: int
    name: str


class WeightsFact(NamedTuple):
    """The weights' size while the model dir has none: a safetensors index or the hub's listing."""

    total: int
    files: int  # shards (0: only the index's total is known)
    source: str  # "model.safetensors.index.json in /src", "the hub's listing of R@abc123456789"


@dataclass(frozen=True)
class PortHolder:
    pid: int | None
    name: str


@dataclass(frozen=True)
class PreflightInputs:
    """The facts the rules need, as plain values (the planner fills them from the probes)."""

    vllm_version: str | None = None
    vllm_version_source: Literal["installed", "spec pin", "unknown"] = "unknown"
    reasoning_parsers: frozenset[str] | None = None  # registered in that version; None: unknown
    tool_parsers: frozenset[str] | None = None
    gpus: tuple[GpuFact, ...] | None = None  # None: not probed (no NVML); then the spec's [gpu] is used
    foreign_gpu_processes: tuple[GpuProcess, ...] = ()  # not ours: never stopped by reconcile
    own_gpu_processes: tuple[GpuProcess, ...] = ()  # our server's or its strays': apply frees them
    nvcc_path: str | None = None  # None: no nvcc under CUDA_HOME nor on PATH
    nvcc_version: str | None = None  # "13.0"
    nvcc_arch_list: tuple[str, ...] | None = None  # `nvcc --list-gpu-arch`; None: not run
    headers_missing: tuple[str, ...] | None = None  # of [cuda] headers; None: toolkit not probed
    venv_has_ninja: bool | None = None  # None: no venv yet
    venv_distributions: Mapping[str, str] | None = None  # PEP 503 name -> version; None: no venv yet
    vllm_requires: tuple[str, ...] | None = None  # vLLM's Requires-Dist lines (its METADATA in the venv)
    venv_python: str | None = None  # "3.12.3" from pyvenv.cfg: what requirement markers are judged by
    model_config: Mapping[str, Any] | None = None  # config.json as it will be after the spec's patch
    hf_quant_config: Mapping[str, Any] | None = None
    tokenizer_config: Mapping[str, Any] | None = None  # its model_max_length caps the derived length
    model_file_sizes: Mapping[str, int] = field(default_factory=dict)  # path in model dir -> bytes
    model_files: frozenset[str] = frozenset()  # paths relative to the model dir
    weights: WeightsFact | None = None  # before download; None: from model_file_sizes, else estimated
    port_state: Literal["free", "ours", "other", "unknown"] = "unknown"
    port_holder: PortHolder | None = None
    api_key_configured: bool = False


@dataclass(frozen=True)
class RuleContext:
    spec: Spec
    server: Server
    inputs: PreflightInputs
    args: Mapping[str, ArgValue]  # canonical flag names without "--"
    written: Mapping[str, str]  # canonical name -> the key as the spec writes it
    tp: int
    utilization: float
    gpus: tuple[GpuFact, ...]  # probed GPUs the server will use (TP x PP x DP of them)
    pp: int = 1
    dp: int = 1

    @property
    def world(self) -> int:
        """GPUs one `vllm serve` uses: tensor x pipeline x data parallel ranks."""
        return self.tp * self.pp * self.dp

    @property
    def version(self) -> str:
        i = self.inputs
        return (
            f"vLLM {i.vllm_version} ({i.vllm_version_source})" if i.vllm_version else "vLLM (version unknown)"
        )

    def arg(self, name: str) -> str:
        return f"args.{self.written.get(name, name)}"


def finding(rule: str, severity: Severity, message: str, fix: str = "", /, **evidence: Any) -> Finding:
    """A rule's verdict; keyword arguments are its evidence (JSON-able)."""
    return Finding(rule=rule, severity=severity, message=message, fix=fix, evidence=evidence)


def context(spec: Spec, server: Server, inputs: PreflightInputs) -> RuleContext:
    args: dict[str, ArgValue] = {}
    written: dict[str, str] = {}
    for key, value in server.args.items():
        name = canonical(key)[2:]
        args[name], written[name] = value, key
    tp = max(1, int(_number(args.get("tensor-parallel-size"), 1)))
    pp = max(1, int(_number(args.get("pipeline-parallel-size"), 1)))
    dp = max(1, int(_number(args.get("data-parallel-size"), 1)))
    gpus: tuple[GpuFact, ...] = ()
    if inputs.gpus:
        ordered = sorted(inputs.gpus, key=lambda g: g.index)
        visible = [p.strip() for p in server.env.get("CUDA_VISIBLE_DEVICES", "").split(",") if p.strip()]
        if visible and all(p.isdigit() for p in visible):
            by_index = {g.index: g for g in ordered}
            ordered = [by_index[int(p)] for p in visible if int(p) in by_index]
        gpus = tuple(ordered[: tp * pp * dp])
    return RuleContext(
        spec=spec,
        server=server,
        inputs=inputs,
        args=args,
        written=written,
        tp=tp,
        utilization=_number(args.get("gpu-memory-utilization"), 0.9),  # vLLM's default
        gpus=gpus,
        pp=pp,
        dp=dp,
    )


def _number(value: object, default: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return default
    try:
        return float(value)
    except ValueError:
        return default


def _pin(spec: Spec) -> str:
    return spec.venv.packages.get("vllm", "") if spec.venv else ""


def _pin_is_exact(spec: Spec) -> bool:
    return _pin(spec).strip().startswith("==")


# --- 1. flags -------------------------------------------------------------------------------------


def _flags(c: RuleContext) -> list[Finding]:
    v = c.inputs.vllm_version
    if v is None:
        msg = "vLLM version unknown (not installed, no exact pin): server flags not checked"
        return [finding("flags.removed", "warning", msg, 'pin vllm in [venv] packages ("==0.26.0")')]
    certain = c.inputs.vllm_version_source == "installed" or _pin_is_exact(c.spec)
    out: list[Finding] = []
    newest = listed_versions()[-1]
    for name, value in c.args.items():
        exists = flag_exists(name, v)
        if exists and not certain and flag_exists(name, newest) is False:
            # A ">=" pin lets pip install the newest release, which no longer has the flag.
            removed = flag_history(name)[1]
            msg = f"--{name} is gone from vLLM {removed} on, which the pin {_pin(c.spec)!r} allows"
            fix = f'pin vllm below {removed} (e.g. "<{removed}"), or {removed_flag_fix(name, value)}'
            out.append(finding("flags.removed", "warning", msg, fix, removed_in=removed))
            continue
        if exists:
            continue
        added, removed = flag_history(name)
        flag = f"--{name}"
        added_rel, rel = release(added or ""), release(v)
        if exists is None or added_rel is None or rel is None:
            why = "the flag lists cannot tell" if exists is None else "no vLLM release 0.10-0.33 lists it"
            out.append(finding("flags.unknown", "warning", f"{flag}: {why} whether {c.version} accepts it"))
        elif added_rel > rel:
            msg = f'{flag} needs vLLM >= {added}; {c.version} rejects it ("unrecognized arguments")'
            fix = f'pin vllm = ">={added}" in [venv] packages, or drop {c.arg(name)}'
            # With a lower-bound pin pip may install a release that has it: a warning, not an error.
            out.append(finding("flags.too-new", "error" if certain else "warning", msg, fix, added_in=added))
        else:  # removed flags do not come back, so even a lower-bound pin is certain to fail
            msg = f'{flag} was removed in vLLM {removed}; {c.version} fails: "unrecognized arguments: {flag}"'
            out.append(
                finding("flags.removed", "error", msg, removed_flag_fix(name, value), removed_in=removed)
            )
    return out or [finding("flags.removed", "info", f"{len(c.args)} server flags exist in {c.version}")]


# --- 2. max-model-len -----------------------------------------------------------------------------


def model_config(c: RuleContext) -> Mapping[str, Any] | None:
    """config.json as vLLM will read it: the patched file plus args.hf-overrides."""
    config = c.inputs.model_config
    return None if config is None else limits.apply_hf_overrides(config, c.args.get("hf-overrides"))


def requested_len(c: RuleContext) -> tuple[int | None, str | None]:
    """(max-model-len as vLLM parses it, an error text); (None, None) for auto or unset."""
    raw = c.args.get("max-model-len")
    try:
        return (None if raw is None else limits.parse_max_model_len(raw)), None
    except limits.MaxLenError as exc:
        return None, str(exc)


def served_len(c: RuleContext) -> tuple[int | None, str]:
    """The max-model-len vLLM will serve and how it was set: the explicit value, else (unset) the
    length it derives from the config; (None, "auto") when it fits the length to memory."""
    requested, error = requested_len(c)
    if requested is not None or error or c.args.get("max-model-len") is not None:
        return requested, "max-model-len" if requested is not None else "auto"
    config = model_config(c)
    if config is None:
        return None, "unset"
    d = limits.derive_max_model_len(
        config,
        c.inputs.vllm_version or "0.30.0",
        tokenizer_config=c.inputs.tokenizer_config,
        disable_sliding_window=c.args.get("disable-sliding-window") is True,
    )
    return d.default, "unset: the derived length"


def memory_table(spec: Spec, inputs: PreflightInputs) -> str:
    """The article-style memory table for a spec's server (or one line saying why there is none)."""
    from reconcile import preflight_memory
    from reconcile.preflight_memory_table import memory_table as table

    if spec.server is None:
        return "no [server]: nothing to size"
    s = preflight_memory.sizing(context(spec, spec.server, inputs))
    return s if isinstance(s, str) else table(s.e, s.weights)


Rule = Callable[[RuleContext], list[Finding]]


def _rules() -> tuple[Rule, ...]:
    from reconcile import (
        preflight_batching,
        preflight_features,
        preflight_hardware,
        preflight_length,
        preflight_memory,
        preflight_parallel,
        preflight_serving,
        preflight_toolchain,
    )

    return (
        _flags,
        *preflight_length.RULES,
        *preflight_memory.RULES,
        *preflight_parallel.RULES,
        *preflight_hardware.RULES,
        *preflight_batching.RULES,
        *preflight_features.RULES,
        *preflight_toolchain.RULES,
        *preflight_serving.RULES,
    )


def run_preflight(spec: Spec, inputs: PreflightInputs) -> tuple[Finding, ...]:
    """Every rule's findings for a spec with a [server]; nothing to check without one."""
    if spec.server is None:
        return ()
    c = context(spec, spec.server, inputs)
    rules = _rules()
    if spec.cuda is None and spec.gpu is None and not inputs.gpus:
        # A CPU-only spec (the demo) builds no kernels: the JIT toolchain rules do not apply.
        from reconcile import preflight_toolchain

        rules = tuple(r for r in rules if r not in preflight_toolchain.RULES)
    return tuple(f for rule in rules for f in rule(c))
