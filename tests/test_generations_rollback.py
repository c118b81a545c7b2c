"""Automatic rollback with real venvs and the fake vllm: a switch whose server never gets ready, and
one whose acceptance chat fails, go back to the last good generation, which keeps serving; the
spec that failed is not retried by scheduled applies until it changes; the option that turns it off."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from reconcile.host import http_request
from tests.apply_support import Demo, demo_in
from tests.generations_support import build_wheelhouse, realizations, server_cmdline, stored_spec


@pytest.fixture
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheelhouse(tmp_path_factory.getbasetemp())


@pytest.fixture
def good(tmp_path: Path, wheels: Path) -> Iterator[Demo]:
    """A demo serving generation 1 (tinyserve 1.0) from its realization."""
    for demo in demo_in(tmp_path):
        stored_spec(demo, wheels, "1.0")
        first = demo.cli("apply")
        assert first.returncode == 2, first.output
        yield demo


def _serving(demo: Demo) -> tuple[str | None, int]:
    """(identity of the running server, /v1/models status through the key)."""
    key = demo.key_file.read_text().strip()
    status = http_request(
        "GET", "127.0.0.1", demo.port, "/v1/models", headers={"Authorization": f"Bearer {key}"}
    ).status
    return demo.server_environ("RECONCILE_IDENTITY"), status


def test_a_switch_whose_server_never_gets_ready_rolls_back_and_is_not_retried_by_the_timer(
    good: Demo, wheels: Path
) -> None:
    identity = good.server_environ("RECONCILE_IDENTITY")
    (venv,) = realizations(good)
    stored_spec(good, wheels, "2.0", env={"FAKE_VLLM_FAIL_WITH": "ValueError: no attention backend XYZ"})
    bad = good.cli("apply")
    assert bad.returncode == 4, bad.output
    assert "automatic rollback to generation 1: the server did not become ready" in bad.stdout, bad.output
    assert _serving(good) == (identity, 200)
    assert f"{venv}/bin/vllm serve" in server_cmdline(good)
    assert good.cli("check").returncode == 0
    starts = good.starts_in_log()

    plan = good.cli("plan")
    assert "held at generation 1 by automatic rollback since" in plan.stdout, plan.output
    timer = good.cli("apply", "--scheduled")  # no restart loop every tick
    assert timer.returncode == 0, timer.output
    assert good.starts_in_log() == starts and _serving(good) == (identity, 200)

    history = good.cli("history").stdout
    assert "✗ failed" in history and "no attention backend XYZ" in history, history

    retry = good.cli("apply")  # on purpose: tries the failed spec again, and comes back again
    assert retry.returncode == 4, retry.output
    assert "retries the spec that failed" in retry.stdout and _serving(good) == (identity, 200)

    stored_spec(good, wheels, "2.0")  # the spec changed: applies follow it again
    fixed = good.cli("apply", "--scheduled")
    assert fixed.returncode == 2, fixed.output
    assert good.server_environ("RECONCILE_IDENTITY") != identity and "hold released" in fixed.stdout
    assert good.cli("check").returncode == 0


def test_a_switch_whose_acceptance_chat_fails_rolls_back_to_the_last_good_generation(
    good: Demo, wheels: Path
) -> None:
    identity = good.server_environ("RECONCILE_IDENTITY")
    stored_spec(good, wheels, "1.0", args={"max-num-seqs": 2}, env={"FAKE_VLLM_CHAT_FAIL": "1"})
    bad = good.cli("apply")
    assert bad.returncode == 4, bad.output
    assert "automatic rollback to generation 1: acceptance check failed: chat: HTTP 500" in bad.stdout, (
        bad.output
    )
    assert _serving(good) == (identity, 200) and good.cli("check").returncode == 0
    starts = good.starts_in_log()
    assert good.cli("apply", "--scheduled").returncode == 0 and good.starts_in_log() == starts


def test_with_automatic_rollback_off_the_failed_switch_stays(good: Demo, wheels: Path) -> None:
    identity = good.server_environ("RECONCILE_IDENTITY")
    stored_spec(good, wheels, "1.0", env={"FAKE_VLLM_CHAT_FAIL": "1"}, server={"auto_rollback": False})
    bad = good.cli("apply")
    assert bad.returncode == 4, bad.output
    assert "acceptance check failed" in bad.stdout and "automatic rollback to" not in bad.stdout
    verdict = [line for line in bad.stdout.splitlines() if line.startswith("Apply ")]
    assert len(verdict) == 1 and verdict[0].endswith("; failed: acceptance."), bad.stdout  # as exit 4 says
    assert good.server_environ("RECONCILE_IDENTITY") != identity
    assert good.cli("check").returncode == 1
