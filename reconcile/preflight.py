"""Preflight: the rules that catch, in `plan`, what would otherwise fail minutes into a vLLM boot.

The planner calls `run_preflight(spec, PreflightInputs(...))`. Here: the inputs, the rules' shared
context, the flags and max-model-len rules; the rest in preflight_{memory,toolchain,serving}.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

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
    apt_unknown: frozenset[str] = frozenset()  # [apt] packages apt's lists cannot install now
    venv_has_ninja: bool | None = None  # None: no venv yet
    ninja_on_path: str | None = None  # a ninja on the PATH the server gets (outside the venv)
    model_config: Mapping[str, Any] | None = None  # config.json as it will be after the spec's patch
    hf_quant_config: Mapping[str, Any] | None = None
    tokenizer_config: Mapping[str, Any] | None = None  # its model_max_length caps the derived length
    model_file_sizes: Mapping[str, int] = field(default_factory=dict)  # path in model dir -> bytes
    model_files: frozenset[str] = frozenset()  # paths relative to the model dir
    model_files_from: Literal["dir", "source", "catalogue"] = "dir"  # where those were seen (not copied yet)
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
    gpus: tuple[GpuFact, ...]  # probed GPUs the server will use

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
    gpus: tuple[GpuFact, ...] = ()
    if inputs.gpus:
        ordered = sorted(inputs.gpus, key=lambda g: g.index)
        visible = [p.strip() for p in server.env.get("CUDA_VISIBLE_DEVICES", "").split(",") if p.strip()]
        if visible and all(p.isdigit() for p in visible):
            by_index = {g.index: g for g in ordered}
            ordered = [by_index[int(p)] for p in visible if int(p) in by_index]
        gpus = tuple(ordered[:tp])
    return RuleContext(
        spec=spec,
        server=server,
        inputs=inputs,
        args=args,
        written=written,
        tp=tp,
        utilization=_number(args.get("gpu-memory-utilization"), 0.9),  # vLLM's default
        gpus=gpus,
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


def _max_model_len(c: RuleContext) -> list[Finding]:
    rule = "max-model-len.derived"
    raw = c.args.get("max-model-len")
    requested, error = requested_len(c)
    if error:
        return [finding(rule, "error", f"{c.arg('max-model-len')}: {error}", 'use an integer, "32k" or "1M"')]
    if raw is not None and requested is None and limits.auto_supported(c.inputs.vllm_version) is False:
        msg = f"max-model-len {raw!r} (fit to memory) needs vLLM >= 0.14.0; {c.version}"
        return [finding(rule, "error", msg, "set an explicit length, or pin vllm >= 0.14.0")]
    config = model_config(c)
    if config is None:
        return [finding(rule, "warning", "config.json not available yet: max-model-len not checked")]
    # Unknown version: both rope rules (yarn scaled up to 0.29, unscaled from 0.30).
    versions = [c.inputs.vllm_version] if c.inputs.vllm_version else ["0.29.0", "0.30.0"]
    window = c.args.get("disable-sliding-window") is True
    derived = [
        limits.derive_max_model_len(
            config, v, tokenizer_config=c.inputs.tokenizer_config, disable_sliding_window=window
        )
        for v in versions
    ]
    if requested is None:
        d = derived[-1]
        return [
            finding(rule, "info", f"max-model-len {raw or 'unset'}: vLLM uses up to {d.value:,} ({d.note})")
        ]
    spelled = f" ({raw!r} = {requested:,}; vLLM reads k as 1000, K as 1024)" if isinstance(raw, str) else ""
    failing = [d for d in derived if not d.allows(requested)]
    allow_long = c.server.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "").lower() in ("1", "true")
    if not failing:
        d = derived[-1]
        msg = f"max-model-len {requested:,} <= derived {d.value:,} ({d.note}){spelled}"
        if allow_long:
            msg += "; VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 is set but not needed"
        return [finding(rule, "info", msg)]
    d = failing[0]
    severity: Severity = "error" if len(failing) == len(derived) else "warning"
    head = f"max-model-len {requested:,}{spelled} is above the {d.value:,} {c.version} derives ({d.note})"
    if severity == "warning":
        head = f"max-model-len {requested:,} fits vLLM <= 0.29 but not 0.30+ ({d.value:,}: yarn unscaled)"
    risk = f'RoPE positions past {d.value:,} give NaN; vLLM: "must be used with extreme caution"'
    evidence = {"derived": d.value, "vllm_error": d.vllm_message(requested)}
    if allow_long:
        msg = f"{head}; VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 lets it start: {risk}"
        return [
            finding(rule, "warning", msg, f"set {c.arg('max-model-len')} = {d.value} exactly", **evidence)
        ]
    fixes = [
        f"set {c.arg('max-model-len')} = {d.value} exactly",
        *limits.ways_to_extend(d, requested, c.inputs.vllm_version, config),
        f'or set [server] env VLLM_ALLOW_LONG_MAX_MODEL_LEN = "1" (risk: {risk})',
    ]
    return [finding(rule, severity, head, "\n".join(fixes), **evidence)]


def memory_table(spec: Spec, inputs: PreflightInputs) -> str:
    """The article-style memory table for a spec's server (or one line saying why there is none)."""
    from reconcile import preflight_memory

    if spec.server is None:
        return "no [server]: nothing to size"
    e = preflight_memory.memory_estimate(context(spec, spec.server, inputs))
    return e if isinstance(e, str) else preflight_memory.memory_table(e)


Rule = Callable[[RuleContext], list[Finding]]


def _rules() -> tuple[Rule, ...]:
    from reconcile import preflight_memory, preflight_serving, preflight_toolchain

    return (
        _flags,
        _max_model_len,
        *preflight_memory.RULES,
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
