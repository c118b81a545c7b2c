"""What every preflight rule reads: the inputs (plain facts from the probes), the rule context
(the server's args by canonical name, TP x PP x DP, the GPUs it uses), and `finding` to make a verdict.

Imported by each rule module and by `reconcile.preflight.gather`, which runs them; it imports no rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from reconcile.plan.records import Finding
from reconcile.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Literal

    from reconcile.plan.records import Severity
    from reconcile.spec.models import ArgValue, Server, Spec
    from reconcile.vllm.attention import Build


class GpuFact(Record):
    index: int  # type: ignore[assignment]  # shadows tuple.index(), which records never use
    name: str
    compute_capability: str  # "12.0"
    total_bytes: int
    free_bytes: int


class GpuProcess(Record):
    pid: int
    gpu_index: int
    used_bytes: int
    name: str


class WeightsFact(Record):
    """The weights' size while the model dir has none: a safetensors index or the hub's listing."""

    total: int
    files: int  # shards (0: only the index's total is known)
    source: str  # "model.safetensors.index.json in /src", "the hub's listing of R@abc123456789"


class PortHolder(Record):
    pid: int | None
    name: str
    answer: str | None = None  # why its /health gave no usable answer (too slow, too large, not HTTP)


class PreflightInputs(Record):
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
    venv_distributions: Mapping[str, str] | None = None  # PEP 503 name -> version; None: no venv yet
    vllm_requires: tuple[str, ...] | None = None  # vLLM's Requires-Dist lines (its METADATA in the venv)
    venv_python: str | None = None  # "3.12.3" from pyvenv.cfg: what requirement markers are judged by
    attention_build: Build | None = None  # vLLM's MLA kernels in the venv; None: no venv (the stock wheel)
    model_config: Mapping[str, Any] | None = None  # config.json as it will be after the spec's patch
    model_numbers: str | None = (
        None  # why config.json (or its quant config) is not used: a number past any model's
    )
    hf_quant_config: Mapping[str, Any] | None = None
    tokenizer_config: Mapping[str, Any] | None = None  # its model_max_length caps the derived length
    model_file_sizes: Mapping[str, int] = MappingProxyType({})  # path in model dir -> bytes
    model_files: frozenset[str] = frozenset()  # paths relative to the model dir
    model_files_from: Literal["dir", "source", "catalogue"] = "dir"  # where those were seen (not copied yet)
    weights: WeightsFact | None = None  # before download; None: from model_file_sizes, else estimated
    # "front": our HAProxy holds it, and this apply stops it first ([front] was taken out)
    port_state: Literal["free", "ours", "front", "other", "unknown"] = "unknown"
    port_holder: PortHolder | None = None
    api_key_configured: bool = False


class RuleContext(Record):
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
    from reconcile.vllm.flags import canonical  # the engine only when rules run (gather's memo)

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


def capability(c: RuleContext) -> tuple[int, str] | None:
    """The lowest compute capability of the GPUs the server uses, as vLLM's int (8.9 -> 89), and
    where it comes from; None when neither NVML nor the spec's [gpu] tells."""
    if c.gpus:
        g = min(c.gpus, key=lambda g: cc_int(g.compute_capability))
        return cc_int(g.compute_capability), f"{g.name} (compute capability {g.compute_capability})"
    cc = c.spec.gpu.compute_capability if c.spec.gpu else None
    return (cc_int(cc), f"[gpu] compute_capability {cc}") if cc else None


def cc_int(text: str) -> int:
    """ "9.0" -> 90, as vLLM's DeviceCapability.to_int (0 for text that is not one)."""
    major, _, minor = text.partition(".")
    try:
        return int(major) * 10 + int(minor or 0)
    except ValueError:
        return 0


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


def model_config(c: RuleContext) -> Mapping[str, Any] | None:
    """config.json as vLLM will read it: the patched file plus args.hf-overrides."""
    from reconcile.vllm import limits

    config = c.inputs.model_config
    return None if config is None else limits.apply_hf_overrides(config, c.args.get("hf-overrides"))


def requested_len(c: RuleContext) -> tuple[int | None, str | None]:
    """(max-model-len as vLLM parses it, an error text); (None, None) for auto or unset."""
    from reconcile.vllm import limits

    raw = c.args.get("max-model-len")
    try:
        return (None if raw is None else limits.parse_max_model_len(raw)), None
    except limits.MaxLenError as exc:
        return None, str(exc)


def served_len(c: RuleContext) -> tuple[int | None, str]:
    """The max-model-len vLLM will serve and how it was set: the explicit value, else (unset) the
    length it derives from the config; (None, "auto") when it fits the length to memory."""
    from reconcile.vllm import limits

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
