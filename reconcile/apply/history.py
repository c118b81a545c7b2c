"""`reconcile history` and `reconcile diff N M`: generations and what differs between two of them.

Called by the CLI. Reads the records of reconcile.apply.generations (never a secret: hashed at rest).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any, TextIO

from reconcile.apply import generations
from reconcile.safety.untrusted import load_json


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def _flags(argv: list[str], venv: str | None) -> dict[str, str]:
    """{"(command)": "<venv>/bin/vllm serve MODEL", "--flag": "values"}: a launch's argv by flag."""
    out: dict[str, str] = {}
    current = "(command)"
    for token in argv:
        if venv and token.startswith(venv.rstrip("/") + "/"):
            token = "<venv>" + token[len(venv.rstrip("/")) :]
        if token.startswith("--"):
            current, _, value = token.partition("=")
            out[current] = value
        else:
            out[current] = f"{out.get(current, '')} {token}".strip()
    return out


def _render(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _changes(label: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    items = []
    render = _render
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if a is None:
            items.append(f"{key} added" + (f" ({render(b)})" if b not in ("", None) else ""))
        elif b is None:
            items.append(f"{key} removed")
        else:
            items.append(f"{key} {render(a)} -> {render(b)}")
    return [f"{label}: {item}" for item in items]


def _config(state_dir: str, digest: str | None) -> dict[str, Any]:
    if not digest:
        return {}
    data = generations.kept_config(state_dir, digest)
    try:
        return _flat(load_json(data)) if data is not None else {"(kept bytes)": "missing"}
    except ValueError:
        return {"(config.json)": f"not JSON, sha256 {digest[:12]}"}


def _front(g: Mapping[str, Any]) -> str:
    """A generation's [front] in words: "none", or HAProxy (its colors on Unix sockets)."""
    front = (g.get("spec") or {}).get("front")
    if not isinstance(front, dict):
        return "none"
    return "HAProxy, colors on Unix sockets"


def differences(state_dir: str, a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Package versions, config.json keys, args, env, venv path and model commit that differ."""
    la, lb = a.get("launch") or {}, b.get("launch") or {}
    va, vb = a.get("venv") or {}, b.get("venv") or {}
    out = _changes("packages", va.get("packages") or {}, vb.get("packages") or {})
    if a.get("config_json") != b.get("config_json"):
        keys = _changes(
            "config.json", _config(state_dir, a.get("config_json")), _config(state_dir, b.get("config_json"))
        )
        out += keys or [
            f"config.json: bytes differ ({str(a.get('config_json'))[:12]} -> "
            f"{str(b.get('config_json'))[:12]})"
        ]
    # The venv's path is its own line below: in argv it would repeat it.
    out += _changes(
        "args", _flags(la.get("argv") or [], va.get("path")), _flags(lb.get("argv") or [], vb.get("path"))
    )
    out += _changes("env", la.get("env") or {}, lb.get("env") or {})
    if va.get("path") != vb.get("path"):
        out.append(f"venv: {va.get('path')} -> {vb.get('path')}")
    fa, fb = _front(a), _front(b)
    if fa != fb:  # what serves on the public port: the server itself, or HAProxy before two colors
        out.append(f"front: {fa} -> {fb}")
    if a.get("model_commit") != b.get("model_commit"):
        out.append(f"model commit: {a.get('model_commit')} -> {b.get('model_commit')}")
    return out


def render_history(state_dir: str, stream: TextIO, serving: int | None = None) -> int:
    """Every generation, oldest first; `*` on `serving` (the generation whose identity the live server
    carries: reconcile.apply.switching.serving_generation), else on the index's current one."""
    found = generations.scan(state_dir)
    if not found:
        stream.write(f"no generations under {generations.profile_dir(state_dir)} (nothing applied yet)\n")
        return 0
    now, hold = serving or generations.current(state_dir), generations.read_hold(state_dir)
    previous: Mapping[str, Any] | None = None
    measured = _bench_figures(state_dir)
    for n, g in found:
        if isinstance(g, str):  # not verified, or malformed: never compared, never rolled back to
            stream.write(f" {n:>3}  skipped: {g}\n")
            continue
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(g.get("created") or 0)))
        verdict = g.get("verdict") or {}
        good = verdict.get("good")
        judged = "✓ served" if good is True else "✗ failed" if good is False else "· unjudged"
        mark = "*" if n == now else " "
        stream.write(f"{mark}{n:>3}  {when}  {judged:<10}  {g.get('reason', '')}\n")
        if verdict.get("good") is False:
            stream.write(f"        {verdict.get('why')}\n")
        if n in measured:
            stream.write(f"        bench: {measured[n]}\n")
        what = differences(state_dir, previous, g) if previous is not None else ["first generation"]
        for line in what[:8]:
            stream.write(f"        {line}\n")
        if len(what) > 8:
            stream.write(f"        … and {len(what) - 8} more (reconcile diff {n - 1} {n})\n")
        previous = g
    if hold is not None:
        stream.write(f"\n{hold.describe()} (`reconcile resume` ends it)\n")
    return 0


def render_diff(state_dir: str, a: int, b: int, stream: TextIO) -> int:
    ga, gb = generations.read(state_dir, a), generations.read(state_dir, b)
    lines = differences(state_dir, ga, gb)
    stream.write(f"generation {a} -> {b}\n")
    for line in lines or ["no difference in what serving depends on"]:
        stream.write(f"  {line}\n")
    return 0


def _bench_figures(state_dir: str) -> dict[int, str]:
    """Each measured generation's headline (`reconcile bench`, or the gate): TTFT and decode tok/s."""
    from reconcile.apply.bench_records import headline, latest_by_generation, runs

    out = {}
    for n, run in latest_by_generation(runs(state_dir)).items():
        h = headline(run)
        parts = [
            f"TTFT {h['ttft_s']:.3f}s" if h["ttft_s"] is not None else "",
            f"decode {h['decode_tok_s']:.1f} tok/s" if h["decode_tok_s"] is not None else "",
            f"{h['aggregate_tok_s']:.0f} tok/s concurrent" if h["aggregate_tok_s"] is not None else "",
        ]
        out[n] = ", ".join(p for p in parts if p)
    return out
