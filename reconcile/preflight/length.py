"""Preflight rule `max-model-len.derived`: the requested length against the one vLLM derives from the
patched config.json (and args.hf-overrides), with the fixes that extend it.

Part of `reconcile.preflight`; same context, same Findings. Ids and failures: docs/preflight.md.
"""

from __future__ import annotations

from reconcile.plan.records import Finding
from reconcile.preflight.context import RuleContext, finding, model_config, requested_len
from reconcile.vllm import limits

TYPE_CHECKING = False
if TYPE_CHECKING:
    from reconcile.plan.records import Severity


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
        if raw is None and d.default != d.value:  # LongRoPE: unset is the original length, not the limit
            why = f"{d.default_reason}; the limit is {d.value:,}"
            msg = f"max-model-len unset: vLLM serves {d.default:,} ({why})"
            return [finding(rule, "info", msg)]
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


RULES = (_max_model_len,)
