"""Whether the engine makes progress, beyond /health: a 1-token keyed chat completion under
`[server.liveness] deadline`, and vLLM's generated-token counter read from /metrics before and after it.

Read only (the stall kept by earlier applies is read, never written: reconcile.liveness). Called by the
prober for the server row (reconcile.resources.server); reconcile.liveness.judge() says what it means.
The key goes only to a listener that is ours (probes.health's guard). prometheus_client's parser is
imported only when the completion did not answer: a converged plan never pays for it.
"""

from __future__ import annotations

import json
import time

from probes.common import Unavailable
from reconcile.host import HttpTooSlow, HttpUnreachable, http_request
from reconcile.identity import endpoint
from reconcile.liveness import EngineSample, read_stall
from reconcile.ownership.sockets import ForeignListener
from reconcile.safety.display import shown

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from reconcile.spec.models import Spec

# vLLM's sample names (0.12+); a counter's sample carries `_total` on the wire.
GENERATED = "vllm:generation_tokens_total"
RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
METRICS_LIMIT = 16 << 20  # as probes.metrics: vLLM's exposition is a few hundred KiB
# prometheus_client's parser takes time quadratic in a line's labels (one line of 300,000 labels, 3.5 MB:
# 48 s; a 16 MiB one about 18 minutes), so the body cap alone does not bound the parse. Only the
# figures' sample lines reach it, at most LINES_MAX of them, each at most LINE_MAX long: vLLM writes
# one line of about 100 bytes per engine and model for each.
LINE_MAX, LINES_MAX = 1024, 1000


def _metrics(host: str, port: int, timeout: float, guard: Callable[[], None]) -> bytes | None:
    """/metrics' body, unparsed (parsed only when needed); None when it does not answer 200. `guard`,
    on every read: the port's listeners must be ours, else ForeignListener (a server that died between
    two reads leaves the port to whoever binds it); a refusal propagates."""
    resp = http_request(
        "GET", host, port, "/metrics", timeout=timeout, limit=METRICS_LIMIT, before_send=guard
    )
    return resp.body if resp.status == 200 else None


def figures(body: bytes | None) -> dict[str, float]:
    """{sample name: sum over its label sets} of the three liveness figures, by prometheus_client's own
    parser; {} when there is no body or it is not the Prometheus text format. Matched by sample name:
    prometheus_client writes a counter's HELP/TYPE as `..._total`, some exporters without the suffix.
    Only the lines of those samples are parsed (their HELP/TYPE comments say nothing the sum needs),
    at most LINES_MAX of at most LINE_MAX: the parse is bounded, as the read is."""
    if body is None:
        return {}
    lines = [
        line
        for line in body.decode("utf-8", errors="replace").split("\n")
        if line.startswith((GENERATED, RUNNING, WAITING))
    ]
    if len(lines) > LINES_MAX or any(len(line) > LINE_MAX for line in lines):
        return {}  # no vLLM writes that: the figures are unknown
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families("\n".join(lines) + "\n"):
            for sample in family.samples:
                if sample.name in (GENERATED, RUNNING, WAITING):
                    out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
    except (ValueError, TypeError, IndexError):  # not Prometheus text: the figures are unknown
        return {}
    # NaN and +Inf are valid sample values; a figure that is not finite is unknown, as a missing one is
    # (kept in a stall, it made the stall file's reader move it aside at every look: never "hung").
    return {name: value for name, value in out.items() if value - value == 0}


def _completion(spec: Spec, deadline: float) -> tuple[bool | None, float, str | None]:
    """(answered, seconds, why unknown): True when a token came back within `deadline`, False when no
    answer came in time, None when the answer says nothing about the engine (refused, an error)."""
    from probes.health import _guard, _headers

    server = spec.server
    assert server is not None
    host, port = endpoint(spec)
    keyed = _headers(spec)
    model = server.served_model_name or server.model or (spec.model.dir if spec.model else "")
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Say OK."}],
        "max_tokens": 1,
        "temperature": 0,
    }
    started = time.monotonic()
    try:
        resp = http_request(
            "POST",
            host,
            port,
            "/v1/chat/completions",
            headers={**keyed, "Content-Type": "application/json"},
            body=json.dumps(body).encode(),
            timeout=deadline,
            before_send=_guard(spec),  # ours only, key or not: a foreign listener is not waited on
        )
    except HttpTooSlow:
        return False, time.monotonic() - started, None
    except ForeignListener as exc:
        return None, time.monotonic() - started, str(exc)
    except HttpUnreachable as exc:
        return None, time.monotonic() - started, str(exc)
    seconds = time.monotonic() - started
    try:  # as data from outside: bounded, nesting refused (HttpResponse.json)
        data = resp.json()
    except ValueError:
        data = None
    usage = data.get("usage") if isinstance(data, dict) else None
    made = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if resp.status == 200 and isinstance(made, int) and made >= 1:
        return True, seconds, None
    text = shown(resp.body[:200].decode("utf-8", errors="replace"), 200)
    return None, seconds, f"the 1-token completion answered HTTP {resp.status}: {text}"


def probe(spec: Spec) -> EngineSample | Unavailable:
    from probes.health import _guard

    server = spec.server
    if server is None or not server.running:
        return Unavailable("the spec wants no server running")
    live = server.liveness
    if not live.check:
        return Unavailable("[server.liveness] check = false")
    host, port = endpoint(spec)
    at = time.time()
    try:  # a port that refuses or is not ours: the health row says so; nothing to judge here
        before = _metrics(host, port, spec.health.timeout, _guard(spec))
    except ForeignListener as exc:
        return Unavailable(f"not checked: {exc}")
    except HttpUnreachable as exc:
        return Unavailable(f"the server does not answer: {exc}")
    answered, seconds, error = _completion(spec, live.deadline)
    prior = read_stall(spec)
    if answered is not False:
        return EngineSample(at, answered, round(seconds, 3), live.deadline, error=error, prior=prior)
    try:  # guarded too: the server may have gone while the completion waited, and its port been taken
        after = _metrics(host, port, spec.health.timeout, _guard(spec))
    except ForeignListener as exc:
        why = f"the port was taken while the 1-token completion waited: {exc}"
        return EngineSample(at, None, round(seconds, 3), live.deadline, error=why, prior=prior)
    except HttpUnreachable:
        after = None
    was, now = figures(before), figures(after)
    return EngineSample(
        at,
        False,
        round(seconds, 3),
        live.deadline,
        was.get(GENERATED),
        now.get(GENERATED),
        now.get(RUNNING),
        now.get(WAITING),
        prior=prior,
    )
