"""Preflight rules for parallelism: TP x PP x DP against the GPUs, and the head counts tensor parallel
must divide (attention, KV, Mamba heads and groups), as vLLM 0.26 checks them at start.

Part of `reconcile.preflight`; same context, same Findings. Ids and failures: docs/preflight.md.
"""

from __future__ import annotations

from reconcile.plan.records import Finding
from reconcile.preflight.context import RuleContext, finding, model_config
from reconcile.vllm.shape import ModelShape, ShapeError, model_shape


def _ranks(c: RuleContext) -> str:
    parts = [f"tensor-parallel-size {c.tp}"]
    if c.pp > 1:
        parts.append(f"pipeline-parallel-size {c.pp}")
    if c.dp > 1:
        parts.append(f"data-parallel-size {c.dp}")
    return " x ".join(parts)


def _gpu_count(c: RuleContext) -> list[Finding]:
    """vLLM starts one worker per rank and gives each a GPU: TP x PP (x DP) must not exceed them."""
    if c.inputs.gpus is not None:
        have, where = len(c.gpus), "visible"
    elif c.spec.gpu is not None and c.spec.gpu.count is not None:
        have, where = c.spec.gpu.count, "in [gpu] count (not probed)"
    else:
        return []
    if c.world <= have:
        return []
    msg = f"{_ranks(c)} needs {c.world} GPUs; {have} {where}"
    if c.pp == 1 and c.dp == 1:
        fix = f"set {c.arg('tensor-parallel-size')} = {have}"
    else:
        fix = f"make {_ranks(c).replace(' x ', ' times ')} at most {have}"
    return [finding("memory.tp", "error", msg, fix, world_size=c.world, gpus=have)]


def _shape(c: RuleContext) -> ModelShape | None:
    config = model_config(c)
    if config is None:
        return None
    try:
        return model_shape(config)
    except ShapeError:
        return None  # memory.fit reports what config.json lacks


def _heads(c: RuleContext) -> list[Finding]:
    s = _shape(c)
    if s is None or c.tp == 1:
        return []
    out = []
    # vllm/config/model.py ModelConfig.verify_with_parallel_config: "Total number of attention heads
    # (N) must be divisible by tensor parallel size (T)."
    if s.num_attention_heads % c.tp:
        msg = f"{s.num_attention_heads} attention heads do not divide by tensor-parallel-size {c.tp}"
        out.append(
            finding("memory.tp", "error", msg, "use a tensor-parallel-size that divides the head count")
        )
    # vllm/model_executor/layers/linear.py QKVParallelLinear.__init__: with TP >= KV heads each head
    # is replicated (divide(tp, kv_heads)), else split (divide(kv_heads, tp)); either must be exact.
    kv = s.num_kv_heads
    if s.mla_dim is None and kv and (c.tp % kv if c.tp >= kv else kv % c.tp):
        msg = (
            f"{kv} KV heads cannot be split over tensor-parallel-size {c.tp}: vLLM needs one to divide "
            f'the other (it fails with "{max(kv, c.tp)} is not divisible by {min(kv, c.tp)}")'
        )
        fits = [t for t in range(1, 2 * max(kv, c.tp)) if (t % kv == 0 if t >= kv else kv % t == 0)]
        near = [t for t in fits if t <= c.tp][-1:] + [t for t in fits if t > c.tp][:1]
        fix = f"use a tensor-parallel-size of {' or '.join(map(str, near))}"
        out.append(finding("memory.tp", "error", msg, fix, num_kv_heads=kv))
    m = s.mamba
    if m is not None:
        # vllm/model_executor/layers/mamba/mamba_mixer2.py MambaMixer2.__init__ asserts both.
        if m.num_heads % c.tp:
            msg = (
                f"{m.num_heads} Mamba heads do not divide by tensor-parallel-size {c.tp} "
                '(vLLM: "Tensor parallel world size must divide num heads.")'
            )
            out.append(finding("memory.tp", "error", msg, "use a tensor-parallel-size that divides them"))
        if m.n_groups % c.tp and m.n_groups != 1:
            msg = (
                f"{m.n_groups} Mamba groups do not divide by tensor-parallel-size {c.tp} (vLLM replicates "
                'groups only when there is one: "... then num_groups must equal 1.")'
            )
            out.append(finding("memory.tp", "error", msg, "use a tensor-parallel-size that divides them"))
    return out


RULES = (_gpu_count, _heads)
