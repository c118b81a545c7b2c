"""Preflight rules for what the server needs at start: model-dir files, parser names, free GPU memory,
its port, and an API key when it listens beyond loopback.

Run by `reconcile.preflight.gather`; same context, same Findings. Ids and failures: docs/preflight.md.
"""

from __future__ import annotations

from fnmatch import fnmatch

from reconcile.plan.records import Finding
from reconcile.preflight.context import RuleContext, finding
from reconcile.vllm.memory import GiB

TYPE_CHECKING = False
if TYPE_CHECKING:
    from reconcile.plan.records import Severity


def _in_model_dir(c: RuleContext, path: str) -> str | None:
    """`path` relative to the model dir when it lies inside it."""
    root = c.spec.model.dir.rstrip("/") + "/" if c.spec.model else None
    return path[len(root) :] if root and path.startswith(root) else None


def _will_download(c: RuleContext, name: str) -> bool:
    """Whether apply brings `name` into the model dir: listed in required_files, or the model is not
    there yet and its whole repo (or the allow_patterns matching it) will be fetched."""
    m = c.spec.model
    if m is None or not (m.repo or m.source) or (m.offline and m.repo):
        return False
    if name in m.required_files:
        return True
    fresh = not c.inputs.model_files
    return fresh and (not m.allow_patterns or any(fnmatch(name, p) for p in m.allow_patterns))


def _plugin(c: RuleContext) -> list[Finding]:
    rule, out = "model.plugin", []
    for flag in ("reasoning-parser-plugin", "tool-parser-plugin"):
        path = c.args.get(flag)
        if not isinstance(path, str):
            continue
        rel = _in_model_dir(c, path)
        if not path.startswith("/"):
            out.append(
                finding(
                    rule,
                    "warning",
                    f"{c.arg(flag)} = {path!r} is relative: vLLM resolves it from the "
                    "server's working directory",
                    f"use {c.spec.model.dir if c.spec.model else '<model dir>'}/{path}",
                )
            )
        elif rel is None:
            out.append(finding(rule, "info", f"{c.arg(flag)} {path}: outside the model dir, not checked"))
        elif rel in c.inputs.model_files:
            where = {
                "dir": "is in the model dir",
                "source": "is in the model's source; apply copies it into the model dir",
                "catalogue": "ships with the model; apply downloads it",
            }[c.inputs.model_files_from]
            out.append(finding(rule, "info", f"{c.arg(flag)} {rel} {where}"))
        elif _will_download(c, rel):
            listed = c.spec.model is not None and rel in c.spec.model.required_files
            how = "apply downloads it" if listed else "apply downloads the model (list it in required_files)"
            out.append(finding(rule, "warning", f"{rel} is not in the model dir yet; {how}"))
        else:
            out.append(
                finding(
                    rule,
                    "error",
                    f"{c.arg(flag)} {path} does not exist: the parser never registers and "
                    'startup fails with "invalid reasoning parser"',
                    f"list {rel} in [model] required_files so apply fetches it, or fix the path",
                    files=sorted(c.inputs.model_files)[:50],
                )
            )
    name = c.args.get("reasoning-parser")
    shipped = sorted(f for f in c.inputs.model_files if "/" not in f and f.endswith("reasoning_parser.py"))
    known = c.inputs.reasoning_parsers
    if (
        isinstance(name, str)
        and "reasoning-parser-plugin" not in c.args
        and shipped
        and (known is None or name not in known)
    ):
        severity: Severity = "warning" if known is None else "error"
        model_dir = c.spec.model.dir if c.spec.model else "<model dir>"
        out.append(
            finding(
                rule,
                severity,
                f"reasoning-parser {name!r} {'may not be' if known is None else 'is not'} built into "
                f"{c.version}; the model ships {', '.join(shipped)} but args has no reasoning-parser-plugin",
                f'set args.reasoning-parser-plugin = "{model_dir}/{shipped[0]}"',
            )
        )
    return out


def _chat_template(c: RuleContext) -> list[Finding]:
    rule = "model.chat-template"
    if c.args.get("enable-auto-tool-choice") is not True:
        return []
    explicit = c.args.get("chat-template")
    if isinstance(explicit, str):
        rel = _in_model_dir(c, explicit)
        if rel is not None and rel not in c.inputs.model_files and not _will_download(c, rel):
            return [
                finding(rule, "error", f"{c.arg('chat-template')} {explicit} does not exist", "fix the path")
            ]
        return [finding(rule, "info", f"chat template {explicit}")]
    files = c.inputs.model_files
    found = [f for f in ("chat_template.jinja", "chat_template.json") if f in files]
    if found or (c.inputs.tokenizer_config or {}).get("chat_template"):
        return [finding(rule, "info", f"chat template: {found[0] if found else 'tokenizer_config.json'}")]
    if not files:
        return [finding(rule, "warning", "model not downloaded yet: chat template not checked")]
    return [
        finding(
            rule,
            "error",
            "tool calling is on but the model dir has no chat template (chat_template.jinja or "
            "tokenizer_config.json chat_template)",
            "set args.chat-template to a .jinja file",
        )
    ]


def _parsers(c: RuleContext) -> list[Finding]:
    rule, out = "model.parsers", []
    tool = c.args.get("tool-call-parser")
    if c.args.get("enable-auto-tool-choice") is True and not tool:
        out.append(
            finding(
                rule,
                "error",
                "enable-auto-tool-choice needs a tool-call-parser (vLLM refuses to start)",
                'set args.tool-call-parser, e.g. "hermes"',
            )
        )
    checks = [
        ("tool-call-parser", c.inputs.tool_parsers, "tool-parser-plugin"),
        ("reasoning-parser", c.inputs.reasoning_parsers, "reasoning-parser-plugin"),
    ]
    for flag, known, plugin in checks:
        name = c.args.get(flag)
        if not isinstance(name, str) or plugin in c.args:
            continue
        if known is None:  # the planner could not list the version's parsers: nothing to say
            continue
        if name in known:
            out.append(finding(rule, "info", f"{flag} {name!r} is built into {c.version}"))
        elif not (
            flag == "reasoning-parser"
            and any(f.endswith("reasoning_parser.py") for f in c.inputs.model_files)
        ):
            out.append(
                finding(
                    rule,
                    "error",
                    f"{flag} {name!r} is not in {c.version} (has: {', '.join(sorted(known))})",
                    f"pick one of those, or add args.{plugin} with the file that registers it",
                )
            )
    return out


def _gpu_free(c: RuleContext) -> list[Finding]:
    rule, out = "host.gpu-free", []
    for g in c.gpus:
        ours = sum(p.used_bytes for p in c.inputs.own_gpu_processes if p.gpu_index == g.index)
        free = g.free_bytes + ours  # a restart frees what our server holds
        want = int(g.total_bytes * c.utilization)
        foreign = [p for p in c.inputs.foreign_gpu_processes if p.gpu_index == g.index]
        held = (
            ", ".join(f"{p.name} (pid {p.pid}, {p.used_bytes / GiB:.1f} GiB)" for p in foreign)
            or "memory NVML does not attribute"
        )
        pids = f": kill {' '.join(str(p.pid) for p in foreign)}" if foreign else ""
        if free < want:
            fits = int(free / g.total_bytes * 100 - 1) / 100
            out.append(
                finding(
                    rule,
                    "error",
                    f"GPU {g.index}: {free / GiB:.2f}/{g.total_bytes / GiB:.2f} GiB free but "
                    f"gpu-memory-utilization {c.utilization:g} asks {want / GiB:.2f} GiB; held by {held}",
                    f"stop them yourself{pids} (reconcile never kills what it did not start), or set "
                    f"{c.arg('gpu-memory-utilization')} = {fits:.2f}",
                    gpu=g.index,
                    processes=[p._asdict() for p in foreign],
                )
            )
    if not out and c.gpus:
        shown = ", ".join(
            f"GPU {g.index} {g.free_bytes / GiB:.1f}/{g.total_bytes / GiB:.1f} GiB" for g in c.gpus
        )
        out.append(finding(rule, "info", f"free: {shown}; gpu-memory-utilization {c.utilization:g} fits"))
    return out


def _port(c: RuleContext) -> list[Finding]:
    port, state, holder = c.server.port, c.inputs.port_state, c.inputs.port_holder
    if state == "other":
        who = "another process" if holder is None else holder.name
        if holder is not None and holder.pid is not None:
            who += f" (pid {holder.pid})"
        if holder and holder.answer:
            who += f"; {holder.answer}"
        return [
            finding("host.port", "error", f"port {port} is held by {who}", "stop it, or change [server] port")
        ]
    if state == "unknown":
        return []
    if state == "front":
        said = f"port {port} is held by our HAProxy, which this apply stops before the server starts there"
        return [finding("host.port", "info", said)]
    return [
        finding(
            "host.port", "info", f"port {port} {'is free' if state == 'free' else 'is held by our server'}"
        )
    ]


def _loopback(host: str) -> bool:
    if host in ("localhost", "127.0.0.1", "::1"):  # the usual answers, without ipaddress's import
        return True
    from ipaddress import ip_address

    try:
        return ip_address(host).is_loopback
    except ValueError:
        return False


def _auth(c: RuleContext) -> list[Finding]:
    host = c.server.host
    keyed = c.inputs.api_key_configured or c.spec.api_key is not None
    if _loopback(host):
        return [finding("host.auth", "info", f"bound to {host}: reachable from this host only")]
    if not keyed:
        return [
            finding(
                "host.auth",
                "error",
                f"[server] host = {host!r} serves the API to the network without an API key",
                'add [api_key] file = "/root/vllm-api.key" (apply makes it, mode 0600) or bind 127.0.0.1',
            )
        ]
    return [finding("host.auth", "info", f"bound to {host} with an API key")]


RULES = (_plugin, _chat_template, _parsers, _gpu_free, _port, _auth)
