"""Preflight rules for the scheduler's batch limits: max-num-batched-tokens against max-model-len (with
chunked prefill off) and against max-num-seqs, as vLLM 0.26's SchedulerConfig checks them at start.

Part of `reconcile.preflight`; same context, same Findings. Ids and failures: docs/preflight.md.
"""

from __future__ import annotations

from reconcile.plan.records import Finding
from reconcile.preflight.context import RuleContext, finding, served_len


def _chunked_prefill_off(c: RuleContext) -> bool:
    # `enable-chunked-prefill = false` launches --no-enable-chunked-prefill; the default is on for
    # generative models (EngineArgs._set_default_chunked_prefill_and_prefix_caching_args).
    return c.args.get("enable-chunked-prefill") is False or c.args.get("no-enable-chunked-prefill") is True


def _batched_tokens(c: RuleContext) -> list[Finding]:
    rule = "scheduler.batched-tokens"
    batched, seqs = c.args.get("max-num-batched-tokens"), c.args.get("max-num-seqs")
    if not isinstance(batched, int) or isinstance(batched, bool):
        # vLLM's default is raised to max-model-len when chunked prefill is off, and caps
        # max-num-seqs (EngineArgs._set_default_max_num_seqs_and_batched_tokens_args).
        return []
    out = []
    length, how = served_len(c)
    # vllm/config/scheduler.py SchedulerConfig.verify_max_model_len
    if length is not None and batched < length and _chunked_prefill_off(c):
        msg = (
            f"max-num-batched-tokens {batched:,} is below max-model-len {length:,} ({how}) with chunked "
            f'prefill off: vLLM fails with "max_num_batched_tokens ({batched}) is smaller than max_model_len '
            f'({length})"'
        )
        fix = f"set {c.arg('max-num-batched-tokens')} >= {length}, or turn chunked prefill back on"
        out.append(finding(rule, "error", msg, fix, max_model_len=length))
    if isinstance(seqs, int) and not isinstance(seqs, bool) and batched < seqs:
        msg = (
            f'max-num-batched-tokens {batched:,} is below max-num-seqs {seqs:,}: vLLM fails with "max_num_'
            f'batched_tokens ({batched}) must be greater than or equal to max_num_seqs ({seqs})"'
        )
        out.append(finding(rule, "error", msg, f"set {c.arg('max-num-seqs')} <= {batched}"))
    if not out:
        out.append(finding(rule, "info", f"max-num-batched-tokens {batched:,} fits the scheduler's limits"))
    return out


RULES = (_batched_tokens,)
