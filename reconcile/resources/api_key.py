"""The API key file: made once, mode and owner as the spec says; its content is never read.

Declares (at the end) the api_key probe (probes.api_key) and the api_key kind; action:
actions.api_key.
"""

from __future__ import annotations

from probes.common import Absent, ProbeFailure
from reconcile.plan.records import Action, ActionResult, Change, FieldDiff, Item
from reconcile.resources.common import Kind, Probe, Progress, change, failed, ok

TYPE_CHECKING = False
if TYPE_CHECKING:
    from reconcile.resources import Observed
    from reconcile.spec.loaded import LoadedSpec
    from reconcile.spec.models import Spec


def plan_api_key(spec: Spec, obs: Observed) -> Item | None:
    if spec.api_key is None:
        return None
    want = spec.api_key
    k = obs.api_key
    if isinstance(k, ProbeFailure):
        return failed(k, "key file")
    mode = want.mode if len(want.mode) == 4 else "0" + want.mode
    if isinstance(k, Absent) or k is None:
        return change(
            Action.CREATE,
            f"generate {want.file} (mode {mode}, owner {want.owner})",
            "the key file does not exist",
            (FieldDiff("file", None, want.file),),
        )
    if k.kind != "file":
        return change(
            Action.CHANGE,
            f"{want.file} is {k.what}, not a regular file",
            "move it aside; apply writes a regular file",
            actionable=False,
        )
    diffs: list[FieldDiff] = []
    if k.mode != mode:
        diffs.append(FieldDiff("mode", k.mode, mode))
    if k.owner != want.owner:
        diffs.append(FieldDiff("owner", k.owner, want.owner))
    if want.group is not None and k.group != want.group:
        diffs.append(FieldDiff("group", k.group, want.group))
    if k.size == 0:
        diffs.append(FieldDiff("size", 0, "a key"))
    if diffs:
        return change(Action.CHANGE, f"fix {want.file}", "the key file is not as the spec says", tuple(diffs))
    return ok(f"{want.file} ({k.mode}, {k.owner})")


def ensure_key(loaded: LoadedSpec, change: Change, progress: Progress) -> ActionResult:
    from actions import api_key

    assert loaded.spec.api_key is not None
    return api_key.ensure_key(loaded.spec.api_key)


PROBES = (Probe("api_key", "probes.api_key", "api_key", tags={"FileFacts": "file"}),)
KINDS = (Kind("api_key", "api_key", ("api_key",), plan_api_key, ensure_key),)
