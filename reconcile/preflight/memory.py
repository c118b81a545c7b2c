"""Preflight rules for GPU memory: the article's hand calculation (weights, KV cache, Mamba state per
GPU against gpu-memory-utilization x GPU memory), checked the way vLLM checks it at start.

Run by `reconcile.preflight.gather`; same context, same Findings. Ids and failures: docs/preflight.md.
The table itself: reconcile.preflight.memory_table.
"""

from __future__ import annotations

from typing import Any

from reconcile.plan.records import Finding
from reconcile.preflight.context import RuleContext, capability, finding, model_config, served_len
from reconcile.preflight.memory_table import memory_table
from reconcile.record import Record
from reconcile.vllm import memory
from reconcile.vllm.architectures import coverage
from reconcile.vllm.families import text_part
from reconcile.vllm.kvspec import MAMBA
from reconcile.vllm.memory import GiB, size
from reconcile.vllm.shape import ShapeError


class Sizing(Record):
    e: memory.MemoryEstimate
    weights: str  # where the weights' size came from: "files", an index, the hub, or "estimate: ..."
    length: str  # how max-model-len was set: "max-model-len", "unset: the derived length", "auto"

    @property
    def estimated(self) -> bool:
        return self.weights.startswith("estimated")


def _gpu(c: RuleContext) -> tuple[int, str] | str:
    if c.gpus:
        return min(g.total_bytes for g in c.gpus), c.gpus[0].name
    if c.spec.gpu and c.spec.gpu.memory_gib:
        return int(c.spec.gpu.memory_gib * GiB), f"{c.spec.gpu.name or 'GPU'} per [gpu] memory_gib"
    return "no GPU probed and no [gpu] memory_gib in the spec"


def sizing(c: RuleContext, *, tp: int | None = None, weights_scale: float = 1.0) -> Sizing | str:
    """The memory table's numbers (at another TP, or with the weights scaled, for the fixes), or why
    they cannot be computed."""
    config = model_config(c)
    if config is None:
        return "config.json not available yet"
    gpu = _gpu(c)
    if isinstance(gpu, str):
        return gpu
    cov = coverage(config, text_part(config)[0])
    if cov.status == "not modelled":
        return (
            f"vLLM {cov.vllm} serves {cov.arch}, but reconcile does not model its KV cache: {cov.why} "
            "(docs/preflight.md, the architecture table)"
        )
    length, how = served_len(c)
    try:
        e = memory.estimate(
            config,
            c.inputs.hf_quant_config,
            c.inputs.model_file_sizes,
            tp=tp or c.tp,
            total_bytes=gpu[0],
            gpu=gpu[1],
            utilization=c.utilization,
            max_model_len=length,
            args=c.args,
            pp=c.pp,
            capability=cc[0] if (cc := capability(c)) else None,
            build=c.inputs.attention_build,
            env=c.server.env,
        )
    except ShapeError as exc:
        return str(exc)
    source = "files"
    if not e.weight_files:  # not downloaded yet: never "fits" on weights counted as 0
        w = c.inputs.weights
        if w is not None:
            e, source = e._replace(weights_total=w.total, weight_files=w.files, notes=()), w.source
        else:
            from reconcile.vllm.weights import estimate

            guess = estimate(config, c.inputs.hf_quant_config)
            note = f"weights estimated from config.json: {guess.how} (not downloaded yet)"
            e = e._replace(weights_total=guess.total_bytes, weight_files=0, notes=(note,))
            source = f"estimated: {guess.how}"
    if cov.note:
        e = e._replace(notes=(*e.notes, cov.note))
    if weights_scale != 1.0:
        e = e._replace(weights_total=int(e.weights_total * weights_scale))
    return Sizing(e, source, how)


def memory_estimate(c: RuleContext) -> memory.MemoryEstimate | str:
    s = sizing(c)
    return s if isinstance(s, str) else s.e


def _fitting_tp(c: RuleContext, heads: int, kv_heads: int) -> int | None:
    """The smallest tensor-parallel-size above the spec's at which one request fits (vLLM's head
    rules hold for it), up to 64 GPUs."""
    for t in range(c.tp + 1, 65):
        if heads % t or (kv_heads and (t % kv_heads if t >= kv_heads else kv_heads % t)):
            continue
        s = sizing(c, tp=t)
        if isinstance(s, Sizing) and s.e.fits and s.e.available_for_cache > 0:
            return t
    return None


def _too_big_fix(c: RuleContext, s: Sizing) -> str:
    e, fixes = s.e, []
    t = _fitting_tp(c, e.shape.num_attention_heads, e.shape.num_kv_heads if e.shape.mla_dim is None else 0)
    if t is not None:
        gpus = f"{t * c.pp * c.dp} GPUs"
        fixes.append(f"set {c.arg('tensor-parallel-size')} = {t} (the smallest that fits; {gpus})")
    if not c.inputs.hf_quant_config and "quantization_config" not in (model_config(c) or {}):  # 16-bit
        for scale, kind in ((0.5, "an FP8"), (0.28, "a 4-bit (AWQ/GPTQ/NVFP4)")):
            q = sizing(c, weights_scale=scale)
            if isinstance(q, Sizing) and q.e.fits and q.e.available_for_cache > 0:
                lead = "or serve" if fixes else "serve"
                fixes.append(f"{lead} {kind} checkpoint of the model (about {size(q.e.weights_total)})")
                break
    return "\n".join(fixes) or "the model does not fit on this machine at any tensor-parallel-size up to 64"


def _evidence(s: Sizing) -> dict[str, Any]:
    e = s.e
    return {
        "table": memory_table(e, s.weights),
        "kv_bytes_per_token_per_gpu": e.kv_per_token,
        "kv_dtype": e.kv_dtype,
        "weights_per_gpu": e.weights_per_gpu,
        "weights_source": s.weights,
        "budget": e.budget,
        "headroom": e.headroom,
        "predicted_kv_cache_tokens": e.kv_capacity_tokens,
        "max_model_len": e.max_model_len,
    }


def _memory(c: RuleContext) -> list[Finding]:
    s = sizing(c)
    if isinstance(s, str):
        return [finding("memory.fit", "warning", f"memory not checked: {s}")]
    e, evidence = s.e, _evidence(s)
    est = " (weights estimated from config.json)" if s.estimated else ""
    if e.available_for_cache <= 0:
        overhead = size(e.overhead.total)
        what = "the weights alone exceed" if e.weights_per_gpu > e.budget else "the weights and overhead fill"
        msg = (
            f"{what} the budget: {size(e.weights_per_gpu)}/GPU at TP {e.tp}"
            f"{f' x PP {e.pp}' if e.pp > 1 else ''} plus {overhead} overhead, against "
            f"{e.utilization:g} x {size(e.total)} = {size(e.budget)}{est}"
        )
        return [finding("memory.fit", "error", msg, _too_big_fix(c, s), **evidence)]
    if e.max_model_len is None:
        msg = f"max-model-len auto: about {e.max_len_that_fits:,} tokens fit ({e.kv_per_token:,} B/token/GPU)"
        return [finding("memory.fit", "warning" if s.estimated else "info", msg + est, **evidence)]
    unset = s.length.startswith("unset")
    length = f"{e.max_model_len:,} tokens" + (" (max-model-len unset: the derived length)" if unset else "")
    if not e.fits:
        # vLLM: "To serve at least one request with the models's max seq len (N), (X GiB KV cache is
        # needed, which is larger than the available KV cache memory (Y GiB)" (kv_cache_utils.py).
        left = (
            f"{size(e.available_for_cache)} is what {e.budget_source} gives the cache"
            if e.budget_source != "gpu-memory-utilization"
            else f"about {size(e.available_for_cache)} is left after weights and overhead "
            f"(estimated{', weights too' if est else ''})"
        )
        msg = f"one request of {length} needs {size(e.one_request)}/GPU of cache; {left}"
        raise_it = e.budget_source.removeprefix("--")
        fix = (
            f"set {c.arg('max-model-len')} <= {e.max_len_that_fits}, or raise {raise_it}, "
            'use kv-cache-dtype = "fp8", or raise tensor-parallel-size'
        )
        return [finding("memory.fit", "error", msg, fix, **evidence)]
    out = _mamba_blocks(c, s)
    if out:
        return out
    if e.headroom < 0:
        # One request fits (vLLM starts) but not max-num-seqs sequences' Mamba state besides it.
        msg = (
            f"one request of {length} fits, but {e.max_num_seqs} sequences' Mamba state "
            f"({size(e.mamba_total)}/GPU) does not fit beside it: short by {size(-e.headroom)}, so vLLM "
            "runs fewer at once"
        )
        fits = max(1, (e.available_for_cache - e.kv_at_max_len) // max(1, e.mamba_per_seq) + 1)
        return [finding("memory.fit", "warning", msg, f"lower {c.arg('max-num-seqs')} to {fits}", **evidence)]
    at = f"{e.max_model_len:,} tokens ({e.kv_dtype}" + (
        "; max-model-len unset: the derived length)" if unset else ")"
    )
    msg = f"KV cache {size(e.kv_at_max_len)}/GPU at {at}; fits{est}"
    return [finding("memory.fit", "warning" if s.estimated else "info", msg, **evidence)]


def _mamba_blocks(c: RuleContext, s: Sizing) -> list[Finding]:
    """vllm/config/compilation.py CompilationConfig.resolve_cudagraph_mode_and_sizes: with full CUDA
    graphs (the default unless enforce-eager) each decode sequence needs one Mamba cache block, and
    "max_num_seqs (N) exceeds available Mamba cache blocks (B)" stops the start."""
    e = s.e
    if e.layout is None or c.args.get("enforce-eager") is True or "compilation-config" in c.args:
        return []
    if not any(g.kind == MAMBA for g in e.layout.groups):
        return []
    blocks = e.layout.num_blocks(e.available_for_cache)
    if e.max_num_seqs <= blocks:
        return []
    msg = (
        f"max-num-seqs {e.max_num_seqs} ({e.max_num_seqs_source}) is more than the {blocks:,} Mamba cache "
        f'blocks that fit: vLLM fails with "max_num_seqs ({e.max_num_seqs}) exceeds available Mamba cache '
        f'blocks ({blocks}) ... CUDA graph capture cannot proceed"'
    )
    fix = (
        f"set {c.arg('max-num-seqs')} <= {blocks}, raise gpu-memory-utilization, or set enforce-eager = true"
    )
    return [finding("memory.fit", "error", msg, fix, mamba_blocks=blocks, **_evidence(s))]


RULES = (_memory,)
