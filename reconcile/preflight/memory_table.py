"""The memory table: the reference article's hand calculation, per GPU, as aligned rows
`label  how  = value`. Built by preflight_memory for the `memory.fit` finding's evidence.
"""

from __future__ import annotations

from reconcile.vllm import memory
from reconcile.vllm.memory import MiB, size


def _weights_how(e: memory.MemoryEstimate, source: str) -> str:
    split = f" / TP {e.tp}" + (f" x PP {e.pp}" if e.pp > 1 else "")
    if source == "files":
        return f"{size(e.weights_total)} in {e.weight_files} files{split}"
    if source.startswith("estimated: "):
        return f"{size(e.weights_total)} estimated ({source[len('estimated: ') :]}){split}"
    shards = f" in {e.weight_files} files" if e.weight_files else ""
    return f"{size(e.weights_total)}{shards} ({source}){split}"


def memory_table(e: memory.MemoryEstimate, weights: str = "files") -> str:
    """The rows for one estimate; `weights` says where the weights' size came from (sizing's)."""
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
        ("weights", _weights_how(e, weights), size(e.weights_per_gpu)),
        ("KV per token", kv_how, f"{e.kv_per_token:,} B"),
    ]
    if e.budget_source != "gpu-memory-utilization":  # vLLM sizes the cache from the flag, not the budget
        how = (
            f"{e.blocks_override:,} blocks x {size(e.layout.block_bytes)}"
            if e.blocks_override is not None and e.layout is not None
            else "as given; vLLM skips its memory profile"
        )
        rows.append(("KV cache memory", f"{e.budget_source}: {how}", size(e.available_for_cache)))
    if e.max_model_len is not None:
        # vLLM's startup check counts whole blocks (and sliding layers only their window), so this is
        # not simply KV per token x tokens.
        extra = ", Mamba state" if s.mamba is not None else ""
        b = e.attention_backend  # MLA: the block size follows the backend vLLM picks on this GPU
        blocks = f"{b.block_size}-token blocks ({b.name})" if b else "vLLM's blocks"
        rows.append(
            (
                "KV at max-model-len",
                f"one request of {e.max_model_len:,} tokens in {blocks}{extra}",
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
            f"activations {size(o.activation)}"
            + (" (Mamba-2 layer peak)" if o.mamba2_peak and o.activation == o.mamba2_peak else "")
            + f" + logits {size(o.logits)} + CUDA graphs {size(o.cuda_graphs)}"
            f" + non-torch {size(o.non_torch)}"
            + (f" + MLA prefill workspace {size(o.mla_workspace)}" if o.mla_workspace else "")
            + (f" + RoPE cache {size(o.rope_cache)}" if o.rope_cache >= MiB else ""),
            size(o.total),
        ),
        (
            "headroom" if e.headroom >= 0 else "short by",
            "budget - weights - overhead - KV at max-model-len - Mamba state"
            if e.budget_source == "gpu-memory-utilization"
            else "KV cache memory - KV at max-model-len - Mamba state",
            size(abs(e.headroom)),
        ),
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
