"""Preflight rule for how the server stops: the drain vLLM is asked for (`--shutdown-timeout`) and a
stop_timeout that outlasts it (a shorter one cuts the drain with SIGKILL). Run by preflight.gather."""

from __future__ import annotations

from reconcile.plan.records import Finding
from reconcile.preflight.context import RuleContext, finding
from reconcile.vllm.draining import EXIT_MARGIN, drain, spec_value
from reconcile.vllm.flags import release


def _drain(c: RuleContext) -> list[Finding]:
    rule, server = "server.drain", c.server
    version = c.inputs.vllm_version
    d = drain(server.args, server.stop_timeout, release(version) if version else None)
    given = spec_value(server.args)
    if given is not None and (isinstance(given, bool) or not _seconds(given)):
        flag = c.arg("shutdown-timeout")
        return [
            finding(
                rule,
                "error",
                f"{flag} = {given!r} is not a whole number of seconds",
                f"set {flag} = 20 (drain up to 20 s on stop), or 0 to abort in-flight requests",
            )
        ]
    if d.cut:
        need = d.seconds + int(EXIT_MARGIN)
        return [
            finding(
                rule,
                "error",
                f"stop_timeout {server.stop_timeout:g}s would SIGKILL vLLM while it drains: "
                f"--shutdown-timeout {d.seconds} plus ~{EXIT_MARGIN:g}s for vLLM to exit",
                f'set [server] stop_timeout = "{need}s", or lower {c.arg("shutdown-timeout")} to '
                f"{max(0, int(server.stop_timeout - EXIT_MARGIN))}",
                drain_s=d.seconds,
                stop_timeout_s=server.stop_timeout,
            )
        ]
    if d.seconds <= 0 and d.source == "default":
        return [
            finding(
                rule,
                "warning",
                f"stop_timeout {server.stop_timeout:g}s leaves no time to drain: a restart aborts in-flight "
                f"requests (vLLM needs ~{EXIT_MARGIN:g}s to exit)",
                f'set [server] stop_timeout = "{int(EXIT_MARGIN) + 20}s" to drain for 20 s',
            )
        ]
    return [finding(rule, "info", d.describe(), drain_s=d.seconds)]


def _seconds(value: object) -> bool:
    return isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit())


RULES = (_drain,)
