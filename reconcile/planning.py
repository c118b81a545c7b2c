"""Desired (Spec) vs observed (probes) -> Plan. One function per resource, in dependency order.

Called by `reconcile plan`, by the executor (whole plan, then `replan_resource` right before and
after each action) and by status. Pure apart from running the probes it is asked to run.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from probes.common import Absent, Invalid, ProbeFailure, Unavailable
from reconcile.engine.versions import numbers
from reconcile.errors import ReconcileError
from reconcile.loaded import LoadedSpec
from reconcile.plan import Change, FieldDiff, Item, Kind, Ok, Plan
from reconcile.planning_server import plan_server, restart_after
from reconcile.probing import Observed, probe_all, probe_some

if TYPE_CHECKING:
    from probes.venv import VenvObservation
    from reconcile.spec import Spec, Venv

Planner = Callable[["Spec", Observed], "Item | None"]

# Resource -> the probes its planner reads. The server's identity covers the venv and the model.
PROBES_FOR: dict[str, tuple[str, ...]] = {
    "gpu": ("gpu",),
    "apt.repositories": ("apt",),
    "apt": ("apt",),
    "cuda.home": ("cuda",),
    "cuda": ("cuda",),
    "venv": ("venv",),
    "venv.packages": ("venv",),
    "model.files": ("model",),
    "model.config": ("model",),
    "api_key": ("api_key",),
    "server": ("server", "health", "venv", "model", "gpu"),
}


def _failed(resource: str, result: object, section: str) -> Change | None:
    """A probe that could not look: a drift apply cannot fix, with the probe's reason."""
    if isinstance(result, (ProbeFailure, Unavailable)):
        return Change(
            resource,
            "~",
            f"cannot be checked: {result.reason}",
            f"the {section} probe failed",
            actionable=False,
        )
    return None


def _giB(n: int | float) -> str:
    return f"{n / 2**30:.1f} GiB"


# --- gpu ---------------------------------------------------------------------------------


def plan_gpu(spec: Spec, obs: Observed) -> Item | None:
    want = spec.gpu
    if want is None:
        return None
    wanted = f"{want.count or 'any number of'}× {want.name or 'GPU'}" + (
        f" ({want.compute_capability})" if want.compute_capability else ""
    )
    inv = obs.gpu
    if isinstance(inv, (Unavailable, ProbeFailure)):
        return Change("gpu", "~", f"unavailable: {inv.reason}", f"the spec wants {wanted}", actionable=False)
    assert inv is not None
    diffs: list[FieldDiff] = []
    if want.count is not None and inv.count != want.count:
        diffs.append(FieldDiff("count", inv.count, want.count))
    names = sorted({g.name for g in inv.gpus})
    if want.name and any(g.name != want.name for g in inv.gpus):
        diffs.append(FieldDiff("name", ", ".join(names), want.name))
    ccs = sorted({g.compute_capability for g in inv.gpus})
    if want.compute_capability and any(g.compute_capability != want.compute_capability for g in inv.gpus):
        diffs.append(FieldDiff("compute_capability", ", ".join(ccs), want.compute_capability))
    if want.min_driver and numbers(inv.driver_version) < numbers(want.min_driver):
        diffs.append(FieldDiff("driver", inv.driver_version, f">= {want.min_driver}"))
    seen = f"{inv.count}× {', '.join(names) or 'no GPU'} ({', '.join(ccs)}), driver {inv.driver_version}"
    if diffs:
        return Change(
            "gpu",
            "~",
            seen,
            f"the spec wants {wanted}; drivers and GPUs are outside apply's reach",
            tuple(diffs),
            actionable=False,
        )
    return Ok("gpu", seen)


# --- apt ---------------------------------------------------------------------------------


def _repo_file(spec: Spec, name: str) -> str:
    assert spec.apt is not None
    return f"{spec.apt.sources_dir.rstrip('/')}/reconcile-{name}.list"


def plan_apt_repositories(spec: Spec, obs: Observed) -> Item | None:
    if spec.apt is None or not spec.apt.repositories:
        return None
    if (bad := _failed("apt.repositories", obs.apt, "apt")) is not None:
        return bad
    from probes.apt import AptObservation

    assert isinstance(obs.apt, AptObservation)
    missing: list[str] = []
    for repo in spec.apt.repositories:
        path = _repo_file(spec, repo.name)
        found = [s for s in obs.apt.sources if s.file == path and s.enabled]
        good = any(
            s.uri.rstrip("/") == repo.uri.rstrip("/")
            and s.suite == repo.suite
            and tuple(s.components) == tuple(repo.components)
            and (s.trusted if repo.trusted else repo.keyring in s.signed_by)
            for s in found
        )
        if not good or (repo.keyring and not obs.apt.keyrings.get(repo.keyring, False)):
            missing.append(repo.name)
    if not missing:
        return Ok("apt.repositories", ", ".join(r.name for r in spec.apt.repositories))
    return Change(
        "apt.repositories",
        "+",
        f"add repository {', '.join(missing)}",
        "the spec names a repository that apt does not have (or its keyring is missing)",
        tuple(FieldDiff(n, None, _repo_file(spec, n)) for n in missing),
        params={"repositories": missing},
    )


def plan_apt(spec: Spec, obs: Observed) -> Item | None:
    if spec.apt is None or not spec.apt.packages:
        return None
    if (bad := _failed("apt", obs.apt, "apt")) is not None:
        return bad
    from probes.apt import AptObservation

    assert isinstance(obs.apt, AptObservation)
    todo: list[str] = []
    diffs: list[FieldDiff] = []
    for entry in spec.apt.packages:
        name, _, pin = entry.partition("=")
        status = obs.apt.packages.get(name)
        have = status.version if status is not None and status.state == "installed" else None
        if have is None or (pin and have != pin):
            todo.append(entry)
            diffs.append(FieldDiff(name, have, pin or "installed"))
    n = len(spec.apt.packages)
    if not todo:
        return Ok("apt", f"{n} package{'s' if n != 1 else ''} installed")
    kind: Kind = "+" if all(d.old is None for d in diffs) else "~"
    deps = ("apt.repositories",) if spec.apt.repositories else ()
    return Change(
        "apt",
        kind,
        f"install {', '.join(todo)}",
        f"{len(todo)} of {n} packages not as the spec says",
        tuple(diffs),
        deps,
        params={"packages": todo},
    )


# --- cuda ---------------------------------------------------------------------------------


def plan_cuda_home(spec: Spec, obs: Observed) -> Item | None:
    if spec.cuda is None:
        return None
    if (bad := _failed("cuda.home", obs.cuda, "cuda")) is not None:
        return bad
    from probes.cuda import CudaToolkit

    assert isinstance(obs.cuda, CudaToolkit)
    home, target = obs.cuda.home, spec.cuda.target
    shown = f"{home.path} -> {home.link_target}" if home.state == "symlink" else f"{home.path} ({home.state})"
    if target is None:
        if home.resolved is None:
            return Change(
                "cuda.home",
                "~",
                f"{home.path} is {home.state}",
                "CUDA_HOME must exist (set [cuda].target to let apply point it)",
                actionable=False,
            )
        return Ok("cuda.home", shown)
    import os

    if home.state == "symlink" and home.resolved is not None and home.resolved == os.path.realpath(target):
        return Ok("cuda.home", shown)
    if home.state == "directory":
        return Change(
            "cuda.home",
            "~",
            f"{home.path} is a real directory, not a symlink",
            f"move it aside (mv {home.path} {home.path}-old) and apply again; apply never deletes it",
            (FieldDiff("target", "(directory)", target),),
            ("apt",),
            actionable=False,
        )
    kind: Kind = "+" if home.state == "absent" else "~"
    return Change(
        "cuda.home",
        kind,
        f"{shown}  =>  {target}",
        "nvcc under CUDA_HOME must be the toolkit the spec names",
        (FieldDiff("target", home.link_target, target),),
        ("apt",) if spec.apt else (),
        params={"home": home.path, "target": target},
    )


def plan_cuda(spec: Spec, obs: Observed) -> Item | None:
    """nvcc, its arch list and the headers: brought by apt packages, so only checked here."""
    if spec.cuda is None:
        return None
    if (bad := _failed("cuda", obs.cuda, "cuda")) is not None:
        return bad
    from probes.cuda import CudaToolkit, Nvcc

    assert isinstance(obs.cuda, CudaToolkit)
    want = spec.cuda
    diffs: list[FieldDiff] = []
    nvcc = obs.cuda.nvcc
    if not isinstance(nvcc, Nvcc):
        diffs.append(FieldDiff("nvcc", None, f"{want.home}/bin/nvcc"))
        archs: tuple[str, ...] = ()
    else:
        archs = nvcc.gpu_archs
        if want.min_version and numbers(nvcc.release) < numbers(want.min_version):
            diffs.append(FieldDiff("nvcc.release", nvcc.release, f">= {want.min_version}"))
        missing_arch = [a for a in want.gpu_arch if a not in archs]
        if missing_arch:
            diffs.append(
                FieldDiff(
                    "nvcc --list-gpu-arch",
                    " ".join(archs) or "(empty)",
                    "includes " + ", ".join(missing_arch),
                )
            )
    missing = [h.name for h in obs.cuda.headers if not h.paths]
    if missing:
        diffs.append(FieldDiff("headers.missing", ", ".join(missing), "(none)"))
    if not diffs:
        found = (
            f"nvcc {nvcc.version} lists {', '.join(want.gpu_arch) or 'its archs'}"
            if isinstance(nvcc, Nvcc)
            else "nvcc"
        )
        return Ok("cuda", f"{found}; {len(obs.cuda.headers)} headers found")
    hint = _header_packages(missing, nvcc.release if isinstance(nvcc, Nvcc) else None)
    summary = "; ".join(f"{d.field}: {d.old}" for d in diffs)
    from reconcile.plan_facts import headers_via

    via = headers_via(
        spec, missing, [d.field for d in diffs], nvcc.release if isinstance(nvcc, Nvcc) else None
    )
    return Change(
        "cuda",
        "~",
        summary,
        f"[apt] packages bring them ({hint})"
        if via
        else "the toolkit comes from apt packages; add them to [apt].packages"
        + (f" ({hint})" if hint else ""),
        tuple(diffs),
        ("apt", "cuda.home"),
        actionable=False,
        via=via,
    )


def _header_packages(headers: list[str], release: str | None) -> str:
    try:
        from reconcile.engine.failures import header_package
    except ImportError:
        return ""
    out = []
    for h in headers:
        pkg = header_package(h, release)
        if pkg:
            out.append(f"{h} <- {pkg}")
    return ", ".join(out)


# --- venv ---------------------------------------------------------------------------------


def plan_venv(spec: Spec, obs: Observed) -> Item | None:
    if spec.venv is None:
        return None
    want = spec.venv
    v = obs.venv
    if isinstance(v, ProbeFailure):
        return _failed("venv", v, "venv")
    if isinstance(v, Absent):
        return Change(
            "venv",
            "+",
            f"create {want.path} with {want.python}",
            "the venv does not exist",
            (FieldDiff("path", None, want.path),),
        )
    if isinstance(v, Invalid):
        return Change(
            "venv",
            "~",
            f"{want.path}: {v.message}",
            "not a virtual environment; move it aside and apply again (apply never deletes it)",
            actionable=False,
        )
    assert v is not None
    diffs: list[FieldDiff] = []
    if isinstance(v.interpreter, Absent) or v.interpreter.resolved is None:
        diffs.append(FieldDiff("interpreter", None, want.python))
    if v.include_system_site_packages != want.system_site_packages:
        diffs.append(
            FieldDiff("system_site_packages", v.include_system_site_packages, want.system_site_packages)
        )
    have_pth = {p.path for p in v.pth_paths}
    for extra in want.extra_site_packages:
        if extra not in have_pth:
            diffs.append(FieldDiff("extra_site_packages", None, extra))
    reason = "the venv differs from the spec"
    if _needs_pip(want, v):
        # What a `python -m venv` killed during ensurepip leaves: the venv exists, pip does not.
        diffs.append(FieldDiff("pip", None, "installed"))
        reason = "pip is missing (a venv whose creation was interrupted): it cannot install the packages"
    if diffs:
        return Change("venv", "~", f"fix {want.path}", reason, tuple(diffs))
    return Ok("venv", f"{want.path} (Python {v.version or '?'})")


def _needs_pip(want: Venv, v: VenvObservation) -> bool:
    """pip is absent, and packages are to be installed with it."""
    if "pip" in v.distributions or all(_satisfies(v.version_of(n), s) for n, s in want.packages.items()):
        return False
    from actions.venv import installer_for

    return installer_for(want) == "pip"


def plan_venv_packages(spec: Spec, obs: Observed) -> Item | None:
    if spec.venv is None or not spec.venv.packages:
        return None
    from probes.venv import VenvObservation

    v = obs.venv
    installed = v if isinstance(v, VenvObservation) else None
    wanted: dict[str, str] = {}
    diffs: list[FieldDiff] = []
    for name, spec_text in spec.venv.packages.items():
        have = installed.version_of(name) if installed else None
        if not _satisfies(have, spec_text):
            wanted[name] = spec_text
            diffs.append(FieldDiff(name, have, spec_text))
    n = len(spec.venv.packages)
    if not wanted:
        assert installed is not None
        shown = ", ".join(f"{k} {installed.version_of(k)}" for k in list(spec.venv.packages)[:3])
        return Ok(
            "venv.packages", f"{n} package{'s' if n != 1 else ''} satisfied ({shown}{', …' if n > 3 else ''})"
        )
    kind: Kind = "+" if all(d.old is None for d in diffs) else "~"
    shown = ", ".join(f"{k}{'' if s == '*' else s}" for k, s in wanted.items())
    return Change(
        "venv.packages",
        kind,
        f"install {shown}",
        f"{len(wanted)} of {n} packages missing or not satisfying the spec",
        tuple(diffs),
        ("venv",),
        params={"packages": wanted},
    )


def _satisfies(version: str | None, spec_text: str) -> bool:
    if version is None:
        return False
    if spec_text == "*":
        return True
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return SpecifierSet(spec_text, prereleases=True).contains(Version(version))
    except InvalidVersion:
        return False


# --- model --------------------------------------------------------------------------------


def plan_model_files(spec: Spec, obs: Observed) -> Item | None:
    if spec.model is None:
        return None
    from probes.model import DownloadRecord, ModelObservation

    want = spec.model
    m = obs.model
    origin = f"{want.repo}@{want.revision}" if want.repo else (want.source or "?")
    if isinstance(m, ProbeFailure):
        return _failed("model.files", m, "model")
    if not isinstance(m, ModelObservation):
        verb = "download" if want.repo else "copy"
        return Change(
            "model.files",
            "+",
            f"{verb} {origin} into {want.dir}",
            "the model directory is absent",
            (FieldDiff("dir", None, want.dir),),
        )
    record = m.record
    diffs: list[FieldDiff] = []
    if not isinstance(record, DownloadRecord):
        diffs.append(FieldDiff("record", None, origin))
    else:
        if want.repo and (record.repo != want.repo or not _same_revision(record, want.revision)):
            had = f"{record.repo}@{record.revision} ({(record.commit or '')[:12]})"
            diffs.append(FieldDiff("revision", had, origin))
        # A patched config.json differs from the recorded size by design: judge its backup instead.
        on_disk = dict(m.files)
        if "config.json.bak" in on_disk:
            on_disk["config.json"] = on_disk["config.json.bak"]
        wrong = [f for f, size in record.files.items() if on_disk.get(f) != size]
        if wrong:
            diffs.append(
                FieldDiff(
                    "files", f"{len(wrong)} missing or wrong size ({', '.join(wrong[:3])})", "as recorded"
                )
            )
        if want.source and not want.repo:
            if record.source != want.source:
                diffs.append(FieldDiff("source", record.source, want.source))
            drift = _source_drift(want.source, on_disk, want.allow_patterns)
            if drift:
                diffs.append(FieldDiff("files", ", ".join(drift[:3]), f"as in {want.source}"))
    if diffs:
        verb = "download" if want.repo else "copy"
        return Change(
            "model.files",
            "~",
            f"{verb} {origin} into {want.dir}",
            "the model's files differ from the spec",
            tuple(diffs),
        )
    if m.missing_required:
        return Change(
            "model.files",
            "~",
            f"missing {', '.join(m.missing_required)}",
            f"{origin} does not bring these required files; add them to the model dir or fix "
            "[model].required_files",
            actionable=False,
        )
    total = sum(m.files.values())
    commit = f" ({record.commit[:12]})" if isinstance(record, DownloadRecord) and record.commit else ""
    if isinstance(record, DownloadRecord) and record.source:
        origin = record.source
    return Ok("model.files", f"{want.dir}: {len(m.files)} files, {_giB(total)}, from {origin}{commit}")


def _same_revision(record: Any, revision: str) -> bool:
    return bool(record.revision == revision or (record.commit and record.commit.startswith(revision)))


def _source_drift(source: str, have: Any, patterns: list[str]) -> list[str]:
    import os

    from actions.model import selected

    out = []
    for root, dirs, files in os.walk(source):
        dirs[:] = [d for d in dirs if d != ".cache"]
        for f in files:
            rel = os.path.relpath(os.path.join(root, f), source)
            if patterns and not selected(rel, patterns):
                continue
            try:
                size = os.path.getsize(os.path.join(root, f))
            except OSError:
                continue
            if have.get(rel) != size:
                out.append(rel)
    return out


def plan_model_config(spec: Spec, obs: Observed) -> Item | None:
    if spec.model is None:
        return None
    from actions.model_config import deep_merge
    from probes.model import JsonDoc, ModelObservation

    patch = spec.model.config
    m = obs.model
    if not isinstance(m, ModelObservation):
        if not patch:
            return None
        from reconcile.plan_facts import source_config

        was = source_config(spec.model)  # a local source's config.json is what the copy brings
        return Change(
            "model.config",
            "~",
            "config.json  + " + _keys(patch),
            "patch the config once the files are in",
            tuple(FieldDiff(k, was.get(k), v) for k, v in patch.items()),
            ("model.files",),
        )
    backup = m.config_backup
    if isinstance(backup, Invalid) or isinstance(m.config, Invalid):
        bad = backup if isinstance(backup, Invalid) else m.config
        assert isinstance(bad, Invalid)
        return Change(
            "model.config",
            "~",
            f"{bad.path}: {bad.message}",
            "fix or remove the file by hand",
            actionable=False,
        )
    if not patch and not isinstance(backup, JsonDoc):
        return None
    config_now = m.config.data if isinstance(m.config, JsonDoc) else {}
    original = backup.data if isinstance(backup, JsonDoc) else config_now
    current = m.config.data if isinstance(m.config, JsonDoc) else None
    desired = deep_merge(original, patch)
    if current == desired:
        if not patch:
            return Ok("model.config", "config.json is the original")
        return Ok("model.config", f"config.json has {_keys(patch)}")
    diffs = _json_diffs(current or {}, desired)
    sign = "+" if all(d.old is None for d in diffs) else "~"
    return Change(
        "model.config",
        "~",
        f"config.json  {sign} {', '.join(d.field for d in diffs[:3])}",
        "config.json differs from the original merged with [model].config",
        tuple(diffs),
        ("model.files",),
        params={"dir": spec.model.dir},
    )


def _keys(patch: dict[str, Any]) -> str:
    return ", ".join(patch)


def _json_diffs(old: Any, new: Any) -> list[FieldDiff]:
    """Per-path old -> new, from deepdiff (imported only when there is a difference to show)."""
    from deepdiff import DeepDiff

    diff = DeepDiff(old, new, ignore_order=False, verbose_level=2)
    out: list[FieldDiff] = []

    def path(p: str) -> str:
        return p.replace("root", "", 1).replace("']['", ".").strip("[]'")

    for p, v in diff.get("dictionary_item_added", {}).items():
        out.append(FieldDiff(path(p), None, v))
    for p, v in diff.get("dictionary_item_removed", {}).items():
        out.append(FieldDiff(path(p), v, None))
    for key in ("values_changed", "type_changes"):
        for p, v in diff.get(key, {}).items():
            out.append(FieldDiff(path(p), v.get("old_value"), v.get("new_value")))
    for key in ("iterable_item_added", "iterable_item_removed"):
        for p, v in diff.get(key, {}).items():
            out.append(
                FieldDiff(
                    path(p), v if key.endswith("removed") else None, v if key.endswith("added") else None
                )
            )
    return out or [FieldDiff("config.json", old, new)]


# --- api key ------------------------------------------------------------------------------


def plan_api_key(spec: Spec, obs: Observed) -> Item | None:
    if spec.api_key is None:
        return None
    want = spec.api_key
    k = obs.api_key
    if isinstance(k, ProbeFailure):
        return _failed("api_key", k, "key file")
    mode = want.mode if len(want.mode) == 4 else "0" + want.mode
    if isinstance(k, Absent) or k is None:
        return Change(
            "api_key",
            "+",
            f"generate {want.file} (mode {mode}, owner {want.owner})",
            "the key file does not exist",
            (FieldDiff("file", None, want.file),),
        )
    if k.kind != "file":
        return Change(
            "api_key",
            "~",
            f"{want.file} is a {k.kind}",
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
        return Change(
            "api_key", "~", f"fix {want.file}", "the key file is not as the spec says", tuple(diffs)
        )
    return Ok("api_key", f"{want.file} ({k.mode}, {k.owner})")


PLANNERS: dict[str, Planner] = {
    "gpu": plan_gpu,
    "apt.repositories": plan_apt_repositories,
    "apt": plan_apt,
    "cuda.home": plan_cuda_home,
    "cuda": plan_cuda,
    "venv": plan_venv,
    "venv.packages": plan_venv_packages,
    "model.files": plan_model_files,
    "model.config": plan_model_config,
    "api_key": plan_api_key,
    "server": plan_server,
}


def plan_items(spec: Spec, obs: Observed) -> list[Item]:
    items = []
    for planner in PLANNERS.values():
        item = planner(spec, obs)
        if item is not None:
            items.append(item)
    return [restart_after(i, spec, obs, items) if i.resource == "server" else i for i in items]


def make_plan(loaded: LoadedSpec, observed: Observed | None = None) -> Plan:
    from concurrent.futures import ThreadPoolExecutor

    from reconcile.preflight_inputs import findings_for
    from reconcile.state import git_info

    spec = loaded.spec
    with ThreadPoolExecutor(max_workers=1) as pool:
        git_future = pool.submit(git_info, loaded.files)
        obs = observed if observed is not None else probe_all(spec)
        items = plan_items(spec, obs)
        findings = findings_for(spec, obs)
        git = git_future.result()
    notes = []
    host = socket.gethostname()
    if spec.machine.hostname and spec.machine.hostname != host:
        notes.append(f"this spec is for host {spec.machine.hostname}; running on {host}")
    if git.dirty:
        at = git.commit and git.commit[:12]
        notes.append(f"{loaded.path} has uncommitted changes (plan reflects the file, not {at})")
    from reconcile.pausing import pause_notes
    from reconcile.pinning import lock_notes
    from reconcile.rendering import _jsonable

    notes += lock_notes(loaded) + pause_notes(spec.machine.state_dir)

    return Plan(
        loaded.path,
        host,
        loaded.sha256,
        git.describe(),
        tuple(items),
        tuple(findings),
        tuple(notes),
        {name: _jsonable(getattr(obs, name)) for name in obs.__dataclass_fields__},
    )


def replan_resource(loaded: LoadedSpec, resource: str) -> Change | None:
    """Probe what `resource` depends on now and plan it alone: None when it already matches.

    A probe or planner that raises becomes a Change apply cannot make, so the executor records a
    failure for this resource instead of losing the report of what it already did."""
    spec = loaded.spec
    try:
        obs = probe_some(spec, PROBES_FOR[resource])
        item = PLANNERS[resource](spec, obs)
    except Exception as exc:
        what = str(exc) if isinstance(exc, ReconcileError) else f"{type(exc).__name__}: {exc}"
        return Change(resource, "~", f"cannot be checked: {what}", "re-planning it failed", actionable=False)
    return item if isinstance(item, Change) else None


def resolved_versions(loaded: LoadedSpec) -> dict[str, Any]:
    """What a generation records as resolved: installed package versions, the model commit and the
    running server's launch identity."""
    from probes.model import DownloadRecord, ModelObservation
    from probes.venv import VenvObservation

    spec = loaded.spec
    obs = probe_some(spec, ("venv", "model", "server"))
    out: dict[str, Any] = {}
    if isinstance(obs.venv, VenvObservation) and spec.venv is not None:
        out["packages"] = {name: obs.venv.version_of(name) for name in spec.venv.packages}
    if isinstance(obs.model, ModelObservation) and isinstance(obs.model.record, DownloadRecord):
        out["model_commit"] = obs.model.record.commit
    if spec.server is not None:
        out["server_identity"] = getattr(obs.server, "running_identity", None)
    return out
