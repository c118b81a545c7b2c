"""A switch under load, end to end through `reconcile apply` and `reconcile rollback` on the demo:
8 streams run the whole time; the old server drains (--shutdown-timeout), so no request in flight is
cut; new connections during the gap are refused and counted."""

from __future__ import annotations

from typing import Any

from tests.apply_support import Demo
from tests.switch_load_support import Load
from tests.test_server_support import wait_for


def _spec(demo: Demo, seqs: int) -> None:
    def edit(doc: Any) -> None:
        doc["server"]["args"]["max-num-seqs"] = seqs
        doc["server"]["env"]["FAKE_VLLM_TOKEN_S"] = "0.02"  # 150 tokens: 3 s per stream
        doc["server"]["env"]["FAKE_VLLM_STARTUP_DELAY"] = "1.0"

    demo.write_spec(edit)


def test_a_drain_restart_under_load_cuts_no_request_and_counts_the_refused(demo: Demo) -> None:
    _spec(demo, 8)
    first = demo.cli("apply")
    assert first.returncode == 2, first.output
    key = demo.key_file.read_text().strip()
    with Load(demo.port, key, demo.name) as load:
        wait_for(lambda: load.tally("before").ok >= 8, 30, "8 whole requests before the switch")
        load.phase = "switch"
        _spec(demo, 9)
        switched = demo.cli("apply")
        assert switched.returncode == 2, switched.output
        load.phase = "after switch"
        wait_for(lambda: load.tally("after switch").ok >= 8, 30, "requests served by the new server")
        load.phase = "rollback"
        back = demo.cli("rollback")
        assert back.returncode in (0, 2), back.output
        load.phase = "after rollback"
        wait_for(lambda: load.tally("after rollback").ok >= 8, 30, "requests served after the rollback")
    s = load.summary()
    assert s["cut"] == 0 and s["failed"] == 0, s
    assert load.tally("switch").refused > 0 and load.tally("rollback").refused > 0, s  # counted, not hidden
    assert load.tally("switch").ok > 0  # the streams in flight at the stop finished whole
    assert "it drains in-flight requests first (up to 20s)" in switched.output
    assert "prepared in" in switched.output and "down for" in switched.output
