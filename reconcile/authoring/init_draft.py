"""The TOML text of `reconcile init`: MachineFacts as a spec, a comment on every section.

Called by the CLI's init command (facts from reconcile.authoring.init_survey). tomlkit keeps the
comments; the result is validated as a Spec before it is returned, so init never writes a spec plan refuses.
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Any

import tomlkit
from tomlkit.items import Table

from reconcile.authoring.init_survey import HEADERS, HELPERS, FoundServer, MachineFacts, generated_at

KEY_FILE = "/root/vllm-api.key"


def _table(*about: str) -> Table:
    t = tomlkit.table()
    for line in about:
        t.add(tomlkit.comment(line))
    return t


def _inline(values: dict[str, Any]) -> Any:
    it = tomlkit.inline_table()
    it.update(values)
    return it


def _gpu(facts: MachineFacts) -> Table | str:
    from probes.gpu import GpuInventory

    inv = facts.gpu
    if not isinstance(inv, GpuInventory) or not inv.gpus:
        return f"No [gpu]: {getattr(inv, 'reason', 'NVML lists no GPU')}."
    t = _table(
        "GPUs and driver, as NVML reports them: plan checks them; apply cannot change them.",
        f"Found {inv.count}× {', '.join(sorted({g.name for g in inv.gpus}))}, "
        f"driver {inv.driver_version} (CUDA {inv.cuda_driver_version}).",
    )
    t.add("count", inv.count)
    if len({g.name for g in inv.gpus}) == 1:
        t.add("name", inv.gpus[0].name)
    if len({g.compute_capability for g in inv.gpus}) == 1:
        t.add("compute_capability", inv.gpus[0].compute_capability)
    t.add("memory_gib", round(min(g.memory_total for g in inv.gpus) / 2**30, 1))
    t.add("min_driver", inv.driver_version)
    return t


def _cuda(facts: MachineFacts) -> Table | str:
    from probes.cuda import Nvcc

    home, nvcc = facts.cuda_home, facts.nvcc
    if home.resolved is None or not isinstance(nvcc, Nvcc):
        why = getattr(nvcc, "reason", "") if not isinstance(nvcc, Nvcc) else f"{home.path} is {home.state}"
        return f"No [cuda]: {why or f'{home.path} is {home.state}'}."
    t = _table(
        "The CUDA toolkit FlashInfer's JIT compiles with: CUDA_HOME, nvcc's release and arch list,",
        f"and the headers it includes. nvcc {nvcc.version} at {nvcc.path}.",
    )
    t.add("home", home.path)
    if home.state == "symlink" and home.link_target == home.resolved:
        t.add("target", home.resolved)  # apply re-points the symlink here should it drift
    elif home.state == "symlink":
        t.add(
            tomlkit.comment(
                f"{home.path} -> {home.link_target} -> {home.resolved}: no target, so apply "
                "leaves the alternatives link alone"
            )
        )
    from probes.gpu import GpuInventory

    if isinstance(facts.gpu, GpuInventory):
        archs = sorted({"compute_" + g.compute_capability.replace(".", "") for g in facts.gpu.gpus})
        t.add("gpu_arch", [a for a in archs if a in nvcc.gpu_archs])
    t.add("min_version", nvcc.release)
    found = [h.name for h in facts.headers if h.paths]
    t.add("headers", found)
    missing = [h for h in HEADERS if h not in found]
    if missing:
        t.add(tomlkit.comment(f"not found here: {', '.join(missing)} (FlashInfer's JIT needs them)"))
    return t


def _apt(facts: MachineFacts) -> Table | str:
    if not facts.cuda_packages:
        return "No [apt]: no CUDA toolkit packages (cuda-*, lib*-dev-X-Y) are installed."
    t = _table(
        "apt packages that must stay installed: the CUDA toolkit's, as dpkg lists them now.",
        "Add `name=version` to pin one. Versions now: "
        + ", ".join(f"{n} {v}" for n, v in list(facts.cuda_packages.items())[:4])
        + (", ..." if len(facts.cuda_packages) > 4 else ""),
    )
    t.add("packages", list(facts.cuda_packages))
    return t


def _venv(facts: MachineFacts) -> Table | str:
    v = facts.venv
    if v is None:
        return f"No [venv]: {facts.venv_how}."
    t = _table(
        "The Python environment holding vLLM: apply creates it and installs `packages` into it.",
        f"{facts.venv_how}; Python {v.version or '?'}.",
    )
    t.add("path", v.path)
    home = v.config.get("executable") or os.path.join(v.config.get("home", "/usr/bin"), "python3")
    t.add("python", home)
    if v.include_system_site_packages:
        t.add("system_site_packages", True)
    extra = [p.path for p in v.pth_paths if p.exists and re.search(r"/(site|dist)-packages/?\Z", p.path)]
    if extra:
        t.add("extra_site_packages", sorted(set(extra)))
    packages = {"vllm": f"=={v.vllm_version}"} if v.vllm_version else {}
    packages |= {n: "*" for n in HELPERS if v.version_of(n)}
    t.add(
        tomlkit.comment(
            'Where vLLM came from, if not PyPI: extra_index_urls = ["https://wheels.vllm.ai/nightly"]'
        )
    )
    t.add("packages", _inline(packages))
    for other in facts.other_venvs:
        t.add(tomlkit.comment(f"another venv with vLLM: {other}"))
    return t


def _server_sections(s: FoundServer) -> tomlkit.TOMLDocument:
    doc = tomlkit.document()
    args = dict(s.args)
    host, port = args.pop("host", "0.0.0.0"), args.pop("port", 8000)
    served = args.pop("served-model-name", None)
    served = served[0] if isinstance(served, list) and served else served
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(served or os.path.basename(str(s.model or "vllm")))).strip(
        "-._"
    )
    if s.model and os.path.isdir(s.model):
        model = _table(
            "The model's files: the directory the server reads. Set repo (and revision) to let",
            "apply download it from the hub; the files there now are kept.",
        )
        model.add("dir", s.model)
    else:
        model = _table("The model from the hub: apply downloads it into dir.")
        model.add("repo", str(s.model))
        model.add("dir", f"/root/models/{os.path.basename(str(s.model))}")
    doc.add("model", model)
    if s.key_on_cmdline or s.key_in_env:
        key = _table(
            "The API key file (mode 0600), given to the server as VLLM_API_KEY, never on its command",
            f"line. Put the key it uses now ({'--api-key' if s.key_on_cmdline else 'VLLM_API_KEY'}) "
            "in this file first, or apply makes a new one.",
        )
        key.add("file", KEY_FILE)
        doc.add("api_key", key)
    server = _table(f"The `vllm serve` process: from pid {s.pid}'s command line (the key left out).")
    if s.secret_flags:
        flags = ", ".join(f"--{f}" for f in s.secret_flags)
        for line in (
            f"Left out: {flags}, whose value holds a secret (every local user reads a command",
            "line): keep each in a file, given to the server in the variable vLLM reads it from:",
            'secret_files = { HF_TOKEN = "/root/hf.token" }.',
        ):
            server.add(tomlkit.comment(line))
    if s.venv is None:
        vllm = next((a for a in s.argv if os.path.basename(a) == "vllm"), "vllm")
        server.add(
            "executable", vllm if vllm.startswith("/") else shutil.which(vllm) or "/usr/local/bin/vllm"
        )
    server.add("host", str(host))
    server.add("port", int(port) if str(port).isdigit() else 8000)
    if served:
        server.add("served_model_name", str(served))
    server.add("log", s.log or f"/var/log/vllm/{name or 'vllm'}.log")
    server.add("args", _inline(args))
    if s.env:
        server.add("env", _inline(s.env))
    doc.add("server", server)
    # The spec's form for any number of deployments (docs/deployments.md): this one, named after it.
    deployment = tomlkit.table(is_super_table=True)
    for key, value in doc.items():
        deployment.add(key, value)
    deployments = tomlkit.table(is_super_table=True)
    deployments.add(name or "vllm", deployment)
    out = tomlkit.document()
    out.add("deployments", deployments)
    return out


def render_spec(facts: MachineFacts, *, state_dir: str, manage_server: bool = False) -> str:
    doc = tomlkit.document()
    doc.add(
        tomlkit.comment(f"Written by `reconcile init` on {facts.hostname} at {generated_at()}: what this")
    )
    doc.add(
        tomlkit.comment(
            "machine has now. Review it; `reconcile plan --spec THIS_FILE` should say No changes."
        )
    )
    machine = _table(
        "Which machine this spec is for (plan warns on another host), and where reconcile keeps",
        "its lock, generations, pause file and last-run report.",
    )
    machine.add("hostname", facts.hostname)
    machine.add("state_dir", state_dir)
    machine.add("description", f"written by reconcile init on {generated_at()[:10]}")
    doc.add("machine", machine)
    for key, part in (
        ("gpu", _gpu(facts)),
        ("cuda", _cuda(facts)),
        ("apt", _apt(facts)),
        ("venv", _venv(facts)),
    ):
        if isinstance(part, str):
            doc.add(tomlkit.nl())
            doc.add(tomlkit.comment(part))
        else:
            doc.add(key, part)
    if facts.server is not None:
        block = _server_sections(facts.server)
        if manage_server:
            for key, value in block.items():
                doc.add(key, value)
        else:
            doc.add(tomlkit.nl())
            doc.add(
                tomlkit.comment(
                    f"A vLLM server runs (pid {facts.server.pid}) that reconcile did not start. To let"
                )
            )
            doc.add(
                tomlkit.comment(
                    "reconcile manage it, uncomment what follows (or run init with --manage-server):"
                )
            )
            doc.add(
                tomlkit.comment("the next apply stops nothing it did not start, so stop that process first.")
            )
            for line in tomlkit.dumps(block).splitlines():
                doc.add(tomlkit.comment(line) if line.strip() else tomlkit.comment(""))
    for note in facts.notes:
        doc.add(tomlkit.comment(note))
    text = tomlkit.dumps(doc)
    _validate(text)
    return text


def _validate(text: str) -> None:
    from reconcile.errors import ReconcileError
    from reconcile.spec.models import Spec

    try:
        Spec.model_validate(tomlkit.parse(text).unwrap())
    except Exception as exc:  # a bug in init, not in the machine: say so with the reason
        raise ReconcileError(f"reconcile init drafted a spec that does not validate (a bug): {exc}") from None
