"""Preflight rules for the modules the server's features import: each enabled feature's distributions
(reconcile/data/vllm_features.json, by vLLM release) against the venv, and vLLM's other declared
requirements the venv lacks. Features fail at run time, not at start, so /health looks fine.

Part of `reconcile.preflight`; same context, same Findings. Ids and failures: docs/preflight.md.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from functools import cache
from typing import Any

from reconcile.plan.records import Finding
from reconcile.preflight.context import RuleContext, finding, model_config
from reconcile.vllm.flags import release

TYPE_CHECKING = False
if TYPE_CHECKING:
    from reconcile.plan.records import Severity

_DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
_PATH = os.path.join(_DATA, "vllm_features.json")
_WITHOUT = {
    "structured-outputs": "every such request answers HTTP 500 while /health and plain chat look fine",
    "quantized-checkpoint": "vLLM fails to build the model config (ModuleNotFoundError)",
    "flashinfer-sampler": "the engine fails at start (ImportError)",
    "flashinfer-attention": "the engine fails at start (ImportError)",
    "tool-parser": "the server fails at start: the parser's module does not import",
    "reasoning-parser": "the server fails at start: the parser's module does not import",
    "bench-serve": "`vllm bench serve` fails with ModuleNotFoundError, so `reconcile bench` measures nothing "
    "and, with [bench] gate = true, every switch fails its gate and rolls back",
}


def _normalize(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


@cache
def _table() -> dict[str, Any]:
    with open(_PATH, encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return data


def features_of(version: str | None) -> Mapping[str, Any] | None:
    """The feature table that holds for a vLLM version (the newest entry at or below it)."""
    rel = release(version or "")
    if rel is None:
        return None
    entries = sorted(_table()["versions"].items(), key=lambda kv: release(kv[0]) or (0,))
    held = [v for k, v in entries if (release(k) or (0,)) <= rel]
    return held[-1] if held else None


def enabled(c: RuleContext, table: Mapping[str, Any]) -> list[tuple[str, str, tuple[str, ...]]]:
    """(feature id, what, distributions) for every feature the spec turns on."""
    out: list[tuple[str, str, tuple[str, ...]]] = []

    def add(fid: str, what: str, dists: list[str]) -> None:
        if fid in table and dists:
            out.append((fid, what, tuple(_normalize(d) for d in dists)))

    if c.args.get("enable-auto-tool-choice") is True or "structured-outputs-config" in c.args:
        add("structured-outputs", table["structured-outputs"]["what"], table["structured-outputs"]["dists"])
    config = model_config(c) or {}
    if config.get("quantization_config") or config.get("compression_config") or c.inputs.hf_quant_config:
        f = table["quantized-checkpoint"]
        add("quantized-checkpoint", f["what"], f["dists"])
    env = c.server.env
    on_cuda = c.spec.gpu is not None or bool(c.inputs.gpus)
    if on_cuda and env.get("VLLM_USE_FLASHINFER_SAMPLER", "1").strip() not in ("0", "false", "False"):
        add("flashinfer-sampler", table["flashinfer-sampler"]["what"], table["flashinfer-sampler"]["dists"])
    backend = str(c.args.get("attention-backend") or env.get("VLLM_ATTENTION_BACKEND") or "")
    if backend.upper().startswith("FLASHINFER"):
        f = table["flashinfer-attention"]
        add("flashinfer-attention", f["what"], f["dists"])
    for fid, flag, plugin in (
        ("tool-parser", "tool-call-parser", "tool-parser-plugin"),
        ("reasoning-parser", "reasoning-parser", "reasoning-parser-plugin"),
    ):
        name = c.args.get(flag)
        if isinstance(name, str) and plugin not in c.args and fid in table:
            add(fid, f"{flag} {name!r}", list(table[fid]["by_name"].get(name, [])))
    if c.spec.bench is not None and "bench-serve" in table:
        add("bench-serve", table["bench-serve"]["what"], table["bench-serve"]["dists"])
    return out


def _features(c: RuleContext) -> list[Finding]:
    rule = "venv.features"
    table = features_of(c.inputs.vllm_version)
    venv = c.spec.venv
    if table is None or venv is None:
        return []
    planned = {_normalize(n) for n in venv.packages}
    installed = c.inputs.venv_distributions
    if installed is None and not venv.no_deps:
        return []  # pip installs vLLM with its declared requirements, which cover every feature
    have = planned | {_normalize(n) for n in installed or {}}
    out = []
    for fid, what, dists in enabled(c, table):
        missing = [d for d in dists if d not in have]
        if not missing:
            out.append(finding(rule, "info", f"{what}: {', '.join(dists)} in the venv", feature=fid))
            continue
        where = venv.path + (" (installed with --no-deps)" if venv.no_deps else "")
        msg = f"{what} needs {', '.join(missing)}, missing from {where}: {_WITHOUT[fid]}"
        listed = ", ".join(d + ' = "*"' for d in missing)
        fix = f"add {listed} to [venv] packages"
        if fid == "flashinfer-sampler":
            fix += ', or set [server] env VLLM_USE_FLASHINFER_SAMPLER = "0"'
        # Packages visible through the system site-packages are not scanned: the rule cannot be sure.
        # The bench is not what serves: its missing modules never stop an apply.
        severity: Severity = "warning" if venv.system_site_packages or fid == "bench-serve" else "error"
        out.append(finding(rule, severity, msg, fix, feature=fid, missing=missing, where=table[fid]["where"]))
    return out


def _requirements(c: RuleContext) -> list[Finding]:
    """An info line: vLLM's declared requirements (its METADATA's Requires-Dist, extras left out)
    that the venv lacks; most are optional at run time, and the features above name those that are not."""
    reqs, installed = c.inputs.vllm_requires, c.inputs.venv_distributions
    if not reqs or installed is None:
        return []
    from packaging.markers import InvalidMarker, UndefinedEnvironmentName
    from packaging.requirements import InvalidRequirement, Requirement

    have = {_normalize(n) for n in installed}
    # Markers are judged for the venv's interpreter, not reconcile's ("six; python_version > '3.11'").
    py = c.inputs.venv_python
    env = {"python_version": ".".join(py.split(".")[:2]), "python_full_version": py} if py else {}
    missing, counted = [], 0
    for line in reqs:
        try:
            r = Requirement(line)
            if r.marker is not None and ("extra" in str(r.marker) or not r.marker.evaluate(env)):
                continue
        except (InvalidRequirement, InvalidMarker, UndefinedEnvironmentName):
            continue
        counted += 1
        if _normalize(r.name) not in have:
            missing.append(_normalize(r.name))
    if not missing:
        msg = f"all {counted} requirements vLLM {c.inputs.vllm_version} declares are in the venv"
        return [finding("venv.requirements", "info", msg)]
    msg = (
        f"{len(missing)} of the {counted} requirements vLLM {c.inputs.vllm_version} declares are not in the "
        f"venv (most are optional at run time): {', '.join(sorted(missing))}"
    )
    return [finding("venv.requirements", "info", msg, missing=sorted(missing))]


RULES = (_features, _requirements)
