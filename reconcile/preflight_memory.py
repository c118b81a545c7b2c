"""Preflight rules for GPU memory: the article's hand calculation (weights, KV cache, Mamba state per
GPU against gpu-memory-utilization x GPU memory) and tensor parallel against GPUs and heads.

Part of `reconcile.preflight`; same context, same Findings. Ids and failures: docs/preflight.md.
"""

from __future__ import annotations

from reconcile.engine import memory
from reconcile.engine.memory import GiB, size
from reconcile.engine.shape import ShapeError
from reconcile.plan import Finding
from reconcile.preflight import RuleContext, finding, model_config, requested_len


def memory_estimate(c: RuleContext) -> memory.MemoryEstimate | str:
    """The memory table's numbers, or why they cannot be computed."""
    config = model_config(c)
    if config is None:
        return "config.json not available yet"
    if c.gpus:
        total, gpu = min(g.total_bytes for g in c.gpus), c.gpus[0].name
    elif c.spec.gpu and c.spec.gpu.memory_gib:
        total, gpu = int(c.spec.gpu.memory_gib * GiB), f"{c.spec.gpu.name or 'GPU'} per [gpu] memory_gib"
    else:
        return "no GPU probed and no [gpu] memory_gib in the spec"
    requested, _ = requested_len(c)
    try:
        return memory.estimate(
            config,
            c.inputs.hf_quant_config,
            c.inputs.model_file_sizes,
            tp=c.tp,
            total_bytes=total,
            gpu=gpu,
            utilization=c.utilization,
            max_model_len=requested,
            args=c.args,
        )
    except ShapeError as exc:
        return str(exc)


def _memory(c: RuleContext) -> list[Finding]:
    e = memory_estimate(c)
    if isinstance(e, str):
        return [finding("memory.fit", "warning", f"memory not checked: {e}")]
    out = []
    evidence = {
        "table": memory_table(e),
        "kv_bytes_per_token_per_gpu": e.kv_per_token,
        "kv_dtype": e.kv_dtype,
        "weights_per_gpu": e.weights_per_gpu,
        "budget": e.budget,
        "headroom": e.headroom,
        "predicted_kv_cache_tokens": e.kv_capacity_tokens,
    }
    if e.max_model_len is None:
        msg = f"max-model-len auto: about {e.max_len_that_fits:,} tokens fit ({e.kv_per_token:,} B/token/GPU)"
        out.append(finding("memory.fit", "info", msg, **evidence))
    elif not e.fits:
        msg = (
            f"one request of {e.max_model_len:,} tokens needs {size(e.one_request)}/GPU of cache; about "
            f"{size(e.available_for_cache)} is left after weights and overhead (estimated)"
        )
        fix = (
            f"set {c.arg('max-model-len')} <= {e.max_len_that_fits}, or raise gpu-memory-utilization, "
            'use kv-cache-dtype = "fp8", or raise tensor-parallel-size'
        )
        if e.max_len_that_fits == 0:
            fix = "weights and overhead fill the budget: raise gpu-memory-utilization or tensor-parallel-size"
        out.append(finding("memory.fit", "error", msg, fix, **evidence))
    else:
        msg = f"KV cache {size(e.kv_at_max_len)}/GPU at {e.max_model_len:,} tokens ({e.kv_dtype}); fits"
        out.append(finding("memory.fit", "info", msg, **evidence))
    if e.mamba_total > max(0, e.available_for_cache):
        msg = (
            f"{e.max_num_seqs} sequences' Mamba state takes {size(e.mamba_total)}/GPU, more than the "
            f"{size(max(0, e.available_for_cache))} left for caches: vLLM cannot run that many at once"
        )
        out.append(finding("memory.fit", "warning", msg, f"lower {c.arg('max-num-seqs')}"))
    return out


def memory_table(e: memory.MemoryEstimate) -> str:
    """The article's hand calculation, per GPU, as aligned rows `label  how  = value`."""
    s = e.shape
    heads = "head" if e.kv_heads == 1 else "heads"
    if s.mla_dim is not None:
        kv_how = f"{s.mla_dim} latent x {e.kv_dtype_bytes} B ({e.kv_dtype}) x {s.attention_layers} layers"
    else:
        kv_how = (
            f"2 (K+V) x {e.kv_heads} KV {heads}/GPU (of {s.num_kv_heads}) x {s.head_dim} head_dim"
            f" x {e.kv_dtype_bytes} B ({e.kv_dtype}) x {s.attention_layers} attention layers"
        )
    o = e.overhead
    rows = [
        ("budget", f"{e.utilization:g} x {size(e.total)} ({e.gpu})", size(e.budget)),
        (
            "weights",
            f"{size(e.weights_total)} in {e.weight_files} files / TP {e.tp}",
            size(e.weights_per_gpu),
        ),
        ("KV per token", kv_how, f"{e.kv_per_token:,} B"),
    ]
    if e.max_model_len is not None:
        rows.append(
            (
                "KV at max-model-len",
                f"{e.kv_per_token:,} B x {e.max_model_len:,} tokens",
                size(e.kv_at_max_len),
            )
        )
    if s.mamba is not None:
        rows.append(
            (
                "Mamba state",
                f"{size(e.mamba_per_seq)}/seq ({s.mamba.layers} layers, ssm {e.ssm_dtype}) x {e.max_num_seqs}"
                f" max-num-seqs ({e.max_num_seqs_source})",
                size(e.mamba_total),
            )
        )
    rows += [
        (
            "overhead (est.)",
            f"activations {size(o.activation)} + logits {size(o.logits)} + CUDA graphs {size(o.cuda_graphs)}"
            f" + non-torch {size(o.non_torch)}",
            size(o.total),
        ),
        ("headroom", "budget - weights - overhead - KV at max-model-len - Mamba state", size(e.headroom)),
        (
            "KV cache (pred.)",
            'compare vLLM\'s "GPU KV cache size: N tokens"',
            f"{e.kv_capacity_tokens:,} tokens",
        ),
    ]
    w1 = max(len(r[0]) for r in rows)
    w2 = max(len(r[1]) for r in rows)
    lines = [f"{a:<{w1}}  {b:<{w2}}  = {c}" for a, b, c in rows]
    return "\n".join(lines + list(e.notes))


RULES = (_memory,)
