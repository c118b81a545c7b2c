"""Preflight rule on the server's arguments: each flag against the vLLM version's flag lists (the
article's failure 1). The max-model-len rule is in `reconcile.preflight.length`.

Run by `reconcile.preflight.gather`; same context, same Findings. Ids and failures: docs/preflight.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reconcile.plan.records import Finding
from reconcile.preflight.context import RuleContext, _pin, _pin_is_exact, finding
from reconcile.vllm.failures import removed_flag_fix
from reconcile.vllm.flags import flag_exists, flag_history, listed_versions, release

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


RULES: tuple[Callable[[RuleContext], list[Finding]], ...] = (_flags,)
