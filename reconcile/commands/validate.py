"""`reconcile validate DIR`: the fleet repository's own CI check, like `terraform validate` or
`nix flake check`. Loads every spec in a directory and runs the preflight against what each spec
declares (its [gpu], its pinned vLLM, the model config reconcile knows or the spec's local source),
offline and without probing this machine: one line per problem, exit 1 on any error.

Called by the CLI. Rules that judge the machine the check runs on (its nvcc and headers, free GPU
memory, who holds the port, the files in a model dir) are left out: the CI runner is not the host.
"""

from __future__ import annotations

import glob
import os
import sys
from typing import TextIO

from reconcile.errors import ReconcileError
from reconcile.plan.records import Finding
from reconcile.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from reconcile.commands.common import Args

# Rules whose verdict is about the machine that runs them, not about the spec.
MACHINE_RULES = frozenset(
    {
        "toolchain.nvcc",
        "toolchain.arch",
        "toolchain.headers",
        "toolchain.ninja",
        "host.gpu-free",
        "host.port",
        "model.plugin",
        "model.chat-template",
        "paths.owner",
        "paths.listener",
        "paths.symlink",
        "start.missing",  # the executable, model source and wheelhouse on the machine that applies
        "venv.features",
        "venv.requirements",
    }
)


class SpecVerdict(Record):
    path: str
    error: str | None  # the spec does not load: its one-line FILE:LINE message
    findings: tuple[Finding, ...]
    extended_by: tuple[str, ...] = ()  # a base: checked through the specs that extend it


def repository_root(directory: str) -> str:
    """The repository `validate` confines its reads to: the git work tree holding `directory` (found
    by its `.git`, without running git in a repository under review), else `directory` itself."""
    at = os.path.realpath(directory)
    while True:
        if os.path.lexists(os.path.join(at, ".git")):
            return at
        if at == "/":
            return os.path.realpath(directory)
        at = os.path.dirname(at)


def _bases(paths: list[str], root: str) -> dict[str, list[str]]:
    """base path -> the specs of the directory that extend it (read as text: a spec that does not
    parse, or leads out of the repository, is reported by its own load)."""
    import re

    from reconcile.spec.provenance import read_confined

    out: dict[str, list[str]] = {}
    for path in paths:
        try:
            text = (read_confined(path, path, root) or b"").decode("utf-8", "replace")
        except ReconcileError:
            continue
        for m in re.finditer(r'^\s*extends\s*=\s*"([^"]+)"', text, re.M):
            base = os.path.normpath(os.path.join(os.path.dirname(path), m.group(1)))
            out.setdefault(base, []).append(path)
    return out


def check_spec(path: str, root: str) -> SpecVerdict:
    """One spec: loaded (lock file pins applied) and preflighted against what it declares. Its files
    are data from a repository under review: nothing outside `root` is read (an `extends`, a lock or
    the spec itself that leads out is an error that shows nothing of what is there)."""
    from reconcile.plan.prober import Observed
    from reconcile.preflight.gather import findings_for
    from reconcile.spec.loader import load_spec
    from reconcile.spec.pins import apply_lock_pins

    try:
        loaded = apply_lock_pins(load_spec(path, within=root), within=root)
    except ReconcileError as exc:
        return SpecVerdict(path, str(exc), ())
    nothing_probed = Observed()
    found = list(findings_for(loaded.spec, nothing_probed, within=root))
    if getattr(loaded.spec, "deployments", None):  # each deployment's rules, then those across them
        from reconcile.preflight.deployments import cross_findings
        from reconcile.spec.deployments import deployments

        every = deployments(loaded)
        for d in every:
            found += [
                f._replace(message=f"[{d.name}] {f.message}")
                for f in findings_for(d.loaded.spec, nothing_probed, within=root)
            ]
        found += cross_findings(every)
    return SpecVerdict(path, None, tuple(f for f in found if f.rule not in MACHINE_RULES))


def validate_dir(directory: str) -> list[SpecVerdict]:
    if not os.path.isdir(directory):
        raise ReconcileError(f"{directory}: not a directory (give the directory that holds the specs)")
    paths = sorted(glob.glob(os.path.join(directory, "*.toml")))
    if not paths:
        raise ReconcileError(f"{directory}: no *.toml spec in it")
    root = repository_root(directory)
    bases = _bases(paths, root)
    out = []
    for path in paths:
        users = bases.get(os.path.normpath(path))
        if users:
            out.append(SpecVerdict(path, None, (), tuple(users)))
        else:
            out.append(check_spec(path, root))
    return out


def render(verdicts: list[SpecVerdict], stream: TextIO, *, strict: bool) -> int:
    """One line per problem (`PATH: severity rule: message (fix: ...)`), a summary line; the exit
    code: 1 when a spec does not load or has a preflight error (with `strict`, a warning too)."""
    failed = 0
    for v in verdicts:
        if v.extended_by:
            names = ", ".join(os.path.basename(p) for p in v.extended_by)
            stream.write(f"{v.path}: a base, checked through {names}\n")
            continue
        if v.error is not None:
            stream.write(f"{v.error}\n")
            failed += 1
            continue
        bad = [f for f in v.findings if f.severity == "error" or (strict and f.severity == "warning")]
        for f in v.findings:
            if f.severity == "info":
                continue
            fix = f" (fix: {f.fix.splitlines()[0]})" if f.fix else ""
            stream.write(f"{v.path}: {f.severity} {f.rule}: {f.message}{fix}\n")
        warnings = sum(1 for f in v.findings if f.severity == "warning")
        if bad:
            failed += 1
        else:
            stream.write(f"{v.path}: ok" + (f" ({warnings} warning(s) above)" if warnings else "") + "\n")
    checked = sum(1 for v in verdicts if not v.extended_by)
    stream.write(f"{checked} spec(s) checked, {failed} failed\n")
    return 1 if failed else 0


def cmd_validate(args: Args) -> int:
    return render(validate_dir(args.directory), sys.stdout, strict=args.strict)
