"""What apply shows while it works: on a terminal one updating line (the installer's output, vLLM's
start-up phases read from its log), cleared before a coloured report; off a terminal full lines;
a warning when the log falls silent; nothing with --quiet. A real pty, real installs, the fake vLLM
printing vLLM 0.26's start-up lines."""

from __future__ import annotations

from typing import Any

import pytest
import tomlkit

from tests.apply_support import Demo
from tests.pty_support import Terminal


def _with(server_env: dict[str, str], package: bool = True) -> Any:
    def edit(doc: Any) -> None:
        env = tomlkit.inline_table()
        env.update({**dict(doc["server"]["env"]), **server_env})
        doc["server"]["env"] = env
        if package:  # something for the installer to do: its lines are the progress
            packages = tomlkit.inline_table()
            packages.update({**dict(doc["venv"]["packages"]), "six": "==1.16.0"})
            doc["venv"]["packages"] = packages

    return edit


def test_on_a_terminal_progress_is_one_updating_line_cleared_before_a_coloured_report(seeded: Demo) -> None:
    seeded.write_spec(_with({"FAKE_VLLM_SILENT_S": "2"}))  # two seconds of "loading weights"
    term = Terminal(seeded.command("apply", "--auto-approve"), cwd=str(seeded.root), env=seeded.env())
    assert term.finish() == 2, term.text
    raw = term.text
    head = raw.index("reconcile apply ·")
    before, report = raw[:head], raw[head:]
    assert "\n" not in before  # every step and detail overwrote the same line
    assert "\r\x1b[K    " in before  # details overwrite the line
    assert "six" in before  # the installer's own lines (pip's or uv's), live
    assert "waiting for /health" in before and ": loading weights" in before
    assert "healthy after" in report and "vLLM's KV cache: 4,194,304 tokens" in report
    assert before.endswith("\r\x1b[K")  # the last progress line is cleared before the report
    assert "\x1b[32m✓\x1b[0m venv.packages" in report  # the report in colour
    assert "\x1b[1;32mconverged\x1b[0m" in report


def test_quiet_on_a_terminal_shows_no_progress(seeded: Demo) -> None:
    seeded.write_spec(_with({}))
    term = Terminal(
        seeded.command("apply", "--auto-approve", "--quiet"), cwd=str(seeded.root), env=seeded.env()
    )
    assert term.finish() == 2, term.text
    assert "…" not in term.text and "waiting for /health" not in term.text


def test_off_a_terminal_progress_is_full_lines_and_a_silent_log_is_warned_about(
    seeded: Demo, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECONCILE_LOG_SILENCE_S", "1")
    seeded.write_spec(_with({"FAKE_VLLM_SILENT_S": "3"}, package=False))
    run = seeded.cli("apply")
    assert run.returncode == 2, run.output
    assert "\r" not in run.stderr and "\x1b[" not in run.stderr and "\x1b[" not in run.stdout
    lines = run.stderr.splitlines()
    assert "  … + server: start" in "\n".join(lines)
    waits = [ln for ln in lines if ln.startswith("    waiting for /health")]
    assert any(ln.endswith(": loading weights") for ln in waits), waits
    assert any("warning: the log has been silent for" in ln for ln in waits), waits
    assert "vLLM's KV cache: 4,194,304 tokens" in run.stdout
