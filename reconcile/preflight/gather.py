"""Turns what the probes saw into the plain facts the preflight rules read, then runs every rule.

Called by the planner. The config the rules judge is the one the server will read: the original
(the backup, or the local source's) merged with the spec's patch, as apply will write it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import ModuleType

from probes.common import Absent, Unavailable
from reconcile.errors import ReconcileError
from reconcile.ownership.sockets import one_line
from reconcile.plan.prober import Observed
from reconcile.plan.records import Finding
from reconcile.preflight.context import GpuFact, GpuProcess, PortHolder, PreflightInputs, WeightsFact
from reconcile.safety.shapes import outlandish_number
from reconcile.safety.untrusted import JSON_LIMIT, load_json, read_regular, walk_tree
from reconcile.spec.provenance import outside, read_confined

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from probes.venv import VenvObservation
    from reconcile.spec.models import Spec


def _read_json(path: str, within: str | None = None, tree: str | None = None) -> Mapping[str, Any] | None:
    """A JSON object, or None. `within` (validate): read only inside that repository, as data (a
    regular file, bounded; reconcile.spec.provenance), so no value from outside it reaches a finding."""
    if within is not None:
        try:
            raw = read_confined(path, path, within, missing_ok=True)
            data = None if raw is None else load_json(raw)
        except (ReconcileError, ValueError):
            return None
        return data if isinstance(data, dict) else None
    try:  # the source is data from outside: a regular file, non-blocking, bounded (class 2)
        data = load_json(read_regular(path, JSON_LIMIT, follow=True, tree=tree))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _vllm_version(spec: Spec, obs: Observed) -> tuple[str | None, str]:
    from probes.venv import VenvObservation

    if isinstance(obs.venv, VenvObservation) and obs.venv.vllm_version:
        return obs.venv.vllm_version, "installed"
    if spec.venv is not None and "vllm" in spec.venv.packages:
        from reconcile.vllm.flags import version_from_pin

        pinned = version_from_pin(spec.venv.packages["vllm"])
        if pinned:
            return pinned, "spec pin"
    return None, "unknown"


def _gpus(
    obs: Observed, own: set[int]
) -> tuple[tuple[GpuFact, ...] | None, list[GpuProcess], list[GpuProcess]]:
    inv = obs.gpu
    if inv is None:  # not probed: probes.gpu (with ctypes) is not imported for an isinstance
        return None, [], []
    from probes.gpu import GpuInventory

    if not isinstance(inv, GpuInventory):
        return None, [], []
    facts: list[GpuFact] = []
    foreign: list[GpuProcess] = []
    ours: list[GpuProcess] = []
    for g in inv.gpus:
        # CUDA's total, which vLLM's gpu-memory-utilization multiplies (NVML's counts the driver's
        # reserve too: +615 MiB on an H200).
        facts.append(GpuFact(g.index, g.name, g.compute_capability, g.cuda_total, g.memory_free))
        if not isinstance(g.processes, Unavailable):  # a record is a tuple too: test the type
            for p in g.processes:
                proc = GpuProcess(p.pid, g.index, p.used_memory or 0, p.name or "?")
                (ours if p.pid in own else foreign).append(proc)
    return tuple(facts), foreign, ours


def _model_facts(spec: Spec, obs: Observed, within: str | None = None) -> dict[str, Any]:
    """The model's config, files and weights as apply will lay them out. `within` (validate): a local
    source outside that repository is neither read nor walked (its facts are then unknown)."""
    from probes.model import JsonDoc, ModelObservation
    from reconcile.jsonmerge import deep_merge

    out: dict[str, Any] = {}
    m, want = obs.model, spec.model
    if want is None:
        return out
    base: Mapping[str, Any] | None = None
    quant: Mapping[str, Any] | None = None
    files: Mapping[str, int] = {}
    root = want.dir
    if isinstance(m, ModelObservation):
        doc = m.config_backup if isinstance(m.config_backup, JsonDoc) else m.config
        base = doc.data if isinstance(doc, JsonDoc) else None
        quant = m.quant_config.data if isinstance(m.quant_config, JsonDoc) else None
        files = m.files
    elif want.source and (within is None or not outside(want.source, within)):
        # not copied yet: judge the source's files, as apply will lay them out, by the data role's
        # path (no link followed from another user's directory; what it leads to is not read)
        real = want.source if within is not None else _data_root(want.source)
        root = real or want.source
        out["model_files_from"] = "source"
        if real is not None:
            base = _read_json(os.path.join(root, "config.json"), within, root)
            quant = _read_json(os.path.join(root, "hf_quant_config.json"), within, root)
            files = _sizes(root, within, None if within is not None else root)
    elif (known := _known_model(want.repo)) is not None:  # not downloaded yet, but a model we know
        base, quant, files = known["config"], known.get("hf_quant_config"), known.get("files", {})
        out["model_files"] = frozenset(files) | frozenset(known.get("other_files", ()))
        out["model_files_from"] = "catalogue"
    # A number no model has (NaN, 1e400, a 401-digit integer) in the model's own files (a hub repo's, a
    # source tree's of another user) ended every rule's arithmetic in ValueError or OverflowError, on
    # every plan: the file is not used, and one finding names the key and the file (tenth round).
    for doc_name, got in (("config.json", base), ("hf_quant_config.json", quant)):
        if got is not None and (bad := outlandish_number(got)) is not None:
            out.setdefault("model_numbers", f"{root}/{doc_name}: {_shown_number(*bad)}")
    if out.get("model_numbers"):
        base = quant = None
    if base is not None:
        merged = deep_merge(base, want.config)
        if (bad := outlandish_number(merged)) is not None:  # the spec's own patch (TOML has inf and nan)
            out["model_numbers"] = f"[model] config: {_shown_number(*bad)}"
        else:
            out["model_config"] = merged
        out["weights"] = _weights_before_download(
            spec, root, files, within, root if out.get("model_files_from") == "source" else None
        )
    out["hf_quant_config"] = quant
    tree = root if out.get("model_files_from") == "source" else None  # nobody's data: links only inside
    tokenizer = _read_json(os.path.join(root, "tokenizer_config.json"), within, tree)
    # Its model_max_length caps the derived length: -1e400 there won min() and ended int() in an
    # OverflowError on every plan (eleventh round). Walked as config.json is; a bad one is not used.
    if tokenizer is not None and (bad := outlandish_number(tokenizer)) is not None:
        out.setdefault("model_numbers", f"{root}/tokenizer_config.json: {_shown_number(*bad)}")
        tokenizer = None
    out["tokenizer_config"] = tokenizer
    out["model_file_sizes"] = dict(files)
    out.setdefault("model_files", frozenset(files))
    return out


def _shown_number(where: str, value: object) -> str:
    from reconcile.safety.display import shown

    return f"{shown(where, 200)} is {shown(repr(value), 40)}, a number no model has"


def _known_model(repo: str | None) -> dict[str, Any] | None:
    from reconcile.vllm.catalogue import known_model

    return known_model(repo)


def _weights_before_download(
    spec: Spec, root: str, files: Mapping[str, int], within: str | None = None, tree: str | None = None
) -> WeightsFact | None:
    """The weights' size while no weight file is there: the safetensors index's total_size (model dir
    or local source), else the hub's listing (one cached metadata call; never when offline)."""
    from reconcile.vllm.weightfiles import weight_files

    if weight_files(files):
        return None  # on disk: the memory rule counts the files themselves
    index = _read_json(os.path.join(root, "model.safetensors.index.json"), within, tree)
    total = None
    if index:
        from reconcile.vllm.weights import index_total  # the model's shape tables: only for an index

        total = index_total(index)
    if total:
        return WeightsFact(total, 0, f"model.safetensors.index.json in {root}")
    m = spec.model
    if m is None or not m.repo or m.source:
        return None
    from probes.hub import HubListing, listing

    offline = m.offline or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    cache = os.path.join(spec.machine.state_dir, "cache", "hub")
    found = listing(m.repo, m.revision, cache, offline=offline)
    if not isinstance(found, HubListing):
        return None
    shards = weight_files(found.sizes)
    if not shards:
        return None
    return WeightsFact(
        sum(shards.values()), len(shards), f"the hub's listing of {m.repo}@{found.commit[:12]}"
    )


def _data_root(source: str) -> str | None:
    """The source's real path by the data role (filesafety.data_root); None for one it refuses (the
    preflight's path check says why) or one not there: nothing is read from it."""
    from reconcile.safety.filesafety import UnsafePath, data_root

    try:
        return data_root(source)
    except (OSError, UnsafePath):
        return None


def _sizes(root: str, within: str | None = None, tree: str | None = None) -> dict[str, int]:
    """Each file's size; `within` (validate): a file that links out of that repository is left out;
    `tree` (a `[model] source`): a link out of it, a FIFO or device, is left out, never stat'ed there."""
    from reconcile.safety.untrusted import SOURCE_ENTRIES, TooMany, tree_stat

    out: dict[str, int] = {}
    try:
        for dirpath, dirs, names in walk_tree(root, SOURCE_ENTRIES):
            dirs[:] = [d for d in dirs if d != ".cache"]
            for n in names:
                full = os.path.join(dirpath, n)
                if within is not None and outside(full, within):
                    continue
                try:
                    size = tree_stat(full, tree).st_size if tree is not None else os.path.getsize(full)
                    out[os.path.relpath(full, root)] = size
                except OSError:
                    continue
    except TooMany:
        return {}  # the model.files row refuses the source, naming the bound
    return out


def _venv_facts(venv: VenvObservation) -> dict[str, Any]:
    """Every distribution the server's interpreter sees (the venv's site-packages and the dirs its
    .pth files add, as the lab's torch is) and vLLM's declared requirements."""
    from probes.venv import requires, scan_site_packages
    from reconcile.vllm.attention import scan_build

    dists = {name: d.version for name, d in venv.distributions.items()}
    dirs = list(venv.site_packages)
    for entry in venv.pth_paths:
        if entry.exists and entry.path not in venv.site_packages:
            dirs.append(entry.path)
            found, _, _ = scan_site_packages(entry.path)
            dists.update({name: d.version for name, d in found.items() if name not in dists})
    vllm = venv.distributions.get("vllm")
    return {
        "venv_distributions": dists,
        "vllm_requires": requires(vllm) if vllm else None,
        "venv_python": venv.version,
        "attention_build": scan_build(dirs),
    }


def inputs_from(spec: Spec, obs: Observed, within: str | None = None) -> PreflightInputs:
    """What the rules judge; `within`: the repository `validate` checks (nothing outside it is read)."""
    from probes.server import ServerObservation
    from probes.venv import VenvObservation

    own = {p.pid for p in obs.server.processes} if isinstance(obs.server, ServerObservation) else set()
    gpus, foreign, ours = _gpus(obs, own)
    version, source = _vllm_version(spec, obs)
    kw: dict[str, Any] = {
        "vllm_version": version,
        "vllm_version_source": source,
        "gpus": gpus,
        "foreign_gpu_processes": tuple(foreign),
        "own_gpu_processes": tuple(ours),
        "api_key_configured": spec.api_key is not None,
    }
    unknown: tuple[str, ...] | None = getattr(obs.apt, "unknown", None)
    if unknown:
        kw["apt_unknown"] = frozenset(unknown)
    if obs.cuda is not None:  # probed (else probes.cuda is not imported for an isinstance)
        kw.update(_cuda_facts(obs.cuda))
    kw["ninja_on_path"] = _ninja_on_path(spec)
    if isinstance(obs.venv, VenvObservation):
        kw["venv_has_ninja"] = obs.venv.has_ninja
        kw.update(_venv_facts(obs.venv))
    elif isinstance(obs.venv, Absent):
        kw["venv_has_ninja"] = None
    kw.update(_model_facts(spec, obs, within))
    if isinstance(obs.server, ServerObservation):
        listener = obs.server.listener
        kw["port_state"] = {"ours": "ours", "foreign": "other", "nobody": "free"}[listener.state]
        if listener.state == "foreign" and _our_front_holds(spec, obs, listener.pid):
            kw["port_state"] = "front"
        elif listener.state == "foreign":
            cmd = one_line(listener.cmdline, 80) or listener.name or "?"
            health = obs.health
            answer = (
                getattr(health, "error", None) if getattr(health, "state", None) == "not_listening" else None
            )
            said = (
                f"`{cmd}` of user {listener.user or '?'}" if listener.pid is not None else listener.describe()
            )
            kw["port_holder"] = PortHolder(listener.pid, said, answer)
    return PreflightInputs(**kw)


def _our_front_holds(spec: Spec, obs: Observed, pid: int | None) -> bool:
    """Whether the port's holder is our HAProxy (its master, or a worker the master forked) that this
    apply takes away: the spec has no [front], and the front probe found ours serving the deployment
    (reconcile.ownership.membership.former_front: pidfile, root, apt's haproxy, our config on its
    command line)."""
    from reconcile.ownership.membership import read_stat

    master = getattr(obs.front, "master", None)
    if getattr(spec, "front", None) is not None or master is None or pid is None:
        return False
    stat = read_stat(pid)
    return pid == master or (stat is not None and stat.ppid == master)


def _cuda_facts(toolkit: object) -> dict[str, Any]:
    from probes.cuda import CudaToolkit, Nvcc

    if not isinstance(toolkit, CudaToolkit):
        return {}
    kw: dict[str, Any] = {"headers_missing": tuple(h.name for h in toolkit.headers if not h.paths)}
    if isinstance(toolkit.nvcc, Nvcc):
        kw["nvcc_path"] = toolkit.nvcc.path
        kw["nvcc_version"] = toolkit.nvcc.release
        kw["nvcc_arch_list"] = toolkit.nvcc.gpu_archs
    return kw


def _ninja_on_path(spec: Spec) -> str | None:
    """The ninja a JIT build in the server would find on its PATH: [server] env PATH, else ours (which
    the server inherits after the venv's bin); None when there is none or the spec has no server."""
    if spec.server is None:
        return None
    import shutil

    ours = os.environ.get("PATH", "")
    path = spec.server.env.get("PATH", ours).replace("$PATH", ours)
    return shutil.which("ninja", path=path)


def findings_for(spec: Spec, obs: Observed, within: str | None = None) -> tuple[Finding, ...]:
    """run_preflight's findings; the rules' part remembered (reconcile.preflight.memo) while the spec,
    the inputs and the rules' code are the same, so a converged plan imports no rule and no engine.
    `within`: the repository `validate` checks (inputs_from)."""
    from reconcile.preflight.paths import path_findings
    from reconcile.preflight.startable import start_findings

    inputs = inputs_from(spec, obs, within)
    # The path and start rules judge the machine's files at the paths the spec names: they walk them,
    # open an exec path for its `#!` line (a device's open can act) and walk read trees whole.
    # `validate` reads a repository under review and nothing outside it: not run there at all.
    found = () if within is not None else path_findings(spec) + start_findings(spec)  # never remembered
    if spec.server is None:
        return found
    from reconcile.preflight.memo import remembered

    return found + remembered(spec, inputs, lambda: rule_findings(spec, inputs))


def run_preflight(spec: Spec, inputs: PreflightInputs) -> tuple[Finding, ...]:
    """The path rule's findings for every spec; every other rule's for a spec with a [server]."""
    from reconcile.preflight.paths import path_findings
    from reconcile.preflight.startable import start_findings

    found = path_findings(spec) + start_findings(spec)
    if spec.server is None:
        return found
    return found + rule_findings(spec, inputs)


def rule_findings(spec: Spec, inputs: PreflightInputs) -> tuple[Finding, ...]:
    """Every rule but the path rule, for a spec with a [server]: pure in the spec and the inputs."""
    from reconcile.preflight import (
        arguments,
        batching,
        features,
        hardware,
        length,
        memory,
        parallel,
        serving,
        stopping,
        toolchain,
    )
    from reconcile.preflight.context import context

    assert spec.server is not None
    c = context(spec, spec.server, inputs)
    by_topic: tuple[ModuleType, ...] = (
        arguments,
        length,
        memory,
        parallel,
        hardware,
        batching,
        features,
        toolchain,
        serving,
        stopping,
    )
    if spec.cuda is None and spec.gpu is None and not inputs.gpus:
        # A CPU-only spec (the demo) builds no kernels: the JIT toolchain rules do not apply.
        by_topic = tuple(m for m in by_topic if m is not toolchain)
    found = tuple(f for module in by_topic for rule in module.RULES for f in rule(c))
    if inputs.model_numbers:  # that file was not used: the rules judged the model as unknown
        fix = "fix or remove that file (a hub repo's: pin another revision); the rules then judge the model"
        bad = Finding(rule="model.numbers", severity="error", message=inputs.model_numbers, fix=fix)
        found = (bad, *found)
    return found


def memory_table(spec: Spec, inputs: PreflightInputs) -> str:
    """The article-style memory table for a spec's server (or one line saying why there is none)."""
    from reconcile.preflight import memory
    from reconcile.preflight.context import context
    from reconcile.preflight.memory_table import memory_table as table

    if spec.server is None:
        return "no [server]: nothing to size"
    s = memory.sizing(context(spec, spec.server, inputs))
    return s if isinstance(s, str) else table(s.e, s.weights)
