"""The serving load vLLM reports on its own `/metrics` (Prometheus text, no key): requests running and
waiting, KV-cache usage, and generation throughput from two reads of its token counter.

Called by `reconcile status` only (never by plan: it costs a second). Read-only.
"""

from __future__ import annotations

import re
import time

from probes.common import ParseError, Unavailable
from reconcile.host import HttpUnreachable, http_request
from reconcile.identity import endpoint
from reconcile.ownership.sockets import ForeignListener
from reconcile.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from reconcile.spec.models import Spec

# vLLM 0.12+ names (vllm:gpu_cache_usage_perc was removed in 0.12); counters carry `_total` on the wire.
RUNNING, WAITING, KV_USAGE = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
)
GENERATED = "vllm:generation_tokens_total"
# vLLM's exposition grows with its histograms (a few hundred KiB for one model); 16 MiB is room to spare.
METRICS_LIMIT = 16 << 20
OLD_KV_USAGE = "vllm:gpu_cache_usage_perc"
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)(?:\s+\d+)?\Z")


class ServingMetrics(Record):
    requests_running: float | None
    requests_waiting: float | None
    kv_cache_usage: float | None  # 0..1
    generation_tokens_per_s: float | None  # over `window_s`
    generation_tokens_total: float | None
    window_s: float


def parse_prometheus(text: str) -> dict[str, float]:
    """{metric name: sum over its label sets} of a Prometheus text exposition (0.0.4)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            raise ParseError(f"not a Prometheus sample line: {line[:120]!r}", text)
        try:
            value = float(m.group(3))
        except ValueError:
            raise ParseError(f"not a number in {line[:120]!r}", text) from None
        out[m.group(1)] = out.get(m.group(1), 0.0) + value
    return out


def _read(host: str, port: int, timeout: float, guard: Callable[[], None]) -> dict[str, float]:
    """One read, sent only once every listener on the port is the deployment's (`guard`): a listener
    that took the port is not the server, and its figures are not its load."""
    resp = http_request(
        "GET", host, port, "/metrics", timeout=timeout, limit=METRICS_LIMIT, before_send=guard
    )
    if resp.status != 200:
        raise ParseError(f"/metrics answered {resp.status}", resp.body[:500].decode(errors="replace"))
    return parse_prometheus(resp.body.decode(errors="replace"))


def probe(spec: Spec, *, window: float = 1.0) -> ServingMetrics | Unavailable:
    """Two reads `window` seconds apart: gauges from the second, throughput from the counter's rise."""
    from probes.health import _guard

    host, port = endpoint(spec)
    timeout, guard = spec.health.timeout, _guard(spec)
    try:
        first, t0 = _read(host, port, timeout, guard), time.monotonic()
        time.sleep(window)
        second, t1 = _read(host, port, timeout, guard), time.monotonic()
    except ForeignListener as exc:
        return Unavailable(f"/metrics not read: {exc}")
    except HttpUnreachable as exc:
        return Unavailable(f"/metrics: {exc}")
    except ParseError as exc:
        return Unavailable(f"/metrics: {exc.message}", exc.raw[:2000])
    rate = None
    if GENERATED in first and GENERATED in second and t1 > t0:
        rate = max(0.0, second[GENERATED] - first[GENERATED]) / (t1 - t0)
    return ServingMetrics(
        second.get(RUNNING),
        second.get(WAITING),
        second.get(KV_USAGE, second.get(OLD_KV_USAGE)),
        rate,
        second.get(GENERATED),
        round(t1 - t0, 3),
    )
