"""Preflight rules on the server's arguments: flags by vLLM version, and max-model-len against what
vLLM derives from config.json (the article's failures 1 and 2).

Run by `reconcile.preflight.gather`; same context, same Findings. Ids and failures: docs/preflight.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reconcile.engine import limits
from reconcile.engine.failures import removed_flag_fix
from reconcile.engine.flags import flag_exists, flag_history, listed_versions, release
from reconcile.plan.records import Finding, Severity
from reconcile.preflight.context import RuleContext, _pin, _pin_is_exact, finding, model_config, requested_len

if TYPE_CHECKING:
    from collections.abc import Callable


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


RULES: tuple[Callable[[RuleContext], list[Finding]], ...] = (_flags, _max_model_len)
