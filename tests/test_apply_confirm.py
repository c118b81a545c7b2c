"""Terraform's confirmation: on a terminal, `apply` shows the plan and changes nothing unless the answer
is `yes`; --auto-approve skips the question; without a terminal (timer, Ansible, pipes) nobody is asked."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.apply_support import Demo, demo_in
from tests.pty_support import Terminal


def _no_venv_no_server(doc: Any) -> None:
    """Quick to apply: only the model files, config.json and the key."""
    for section in ("venv", "server"):
        del doc[section]


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    for d in demo_in(tmp_path):
        d.write_spec(_no_venv_no_server)
        yield d


def _terminal(demo: Demo, *args: str) -> Terminal:
    return Terminal(demo.command(*args), cwd=str(demo.root), env=demo.env())


@pytest.mark.parametrize("answer", ["no", "y", ""])
def test_on_a_terminal_apply_shows_the_plan_and_anything_but_yes_changes_nothing(
    demo: Demo, answer: str
) -> None:
    term = _terminal(demo, "apply")
    term.expect("Enter a value:")
    assert (
        "+ api_key" in term.plain and "Plan: " in term.plain and "Only 'yes' will be accepted" in term.plain
    )
    term.send(answer)
    assert term.finish() == 1
    assert "apply cancelled" in term.plain
    assert not demo.key_file.exists() and not demo.model_dir.exists()
    assert not demo.last_run.exists()  # a person saying no is not a run for monitoring


def test_on_a_terminal_yes_applies_what_was_shown(demo: Demo) -> None:
    term = _terminal(demo, "apply")
    term.expect("Enter a value:")
    term.send("yes")
    assert term.finish() == 2, term.text
    assert demo.key_file.exists() and (demo.model_dir / "config.json.bak").exists()
    assert "Apply converged" in term.plain


def test_auto_approve_on_a_terminal_asks_nothing(demo: Demo) -> None:
    term = _terminal(demo, "apply", "--auto-approve")
    assert term.finish() == 2, term.text
    assert "Enter a value" not in term.plain
    assert demo.key_file.exists()


def test_a_converged_machine_is_not_asked_about(demo: Demo) -> None:
    assert demo.cli("apply").returncode == 2  # no terminal: proceeds, as the timer's and Ansible's runs do
    term = _terminal(demo, "apply")
    assert term.finish() == 0, term.text
    assert "Enter a value" not in term.plain


def test_without_a_terminal_apply_proceeds_without_asking(demo: Demo) -> None:
    run = demo.cli("apply")
    assert run.returncode == 2, run.output
    assert "Enter a value" not in run.output
    assert demo.key_file.exists()


def test_on_a_terminal_rollback_shows_the_plan_and_asks_too(demo: Demo) -> None:
    def other_factor(doc: Any) -> None:
        _no_venv_no_server(doc)
        doc["model"]["config"]["rope_parameters"]["factor"] = 3.0

    assert demo.cli("apply").returncode == 2
    demo.write_spec(other_factor)
    assert demo.cli("apply").returncode == 2 and len(demo.generations()) == 2
    term = _terminal(demo, "rollback")
    term.expect("Enter a value:")
    assert "reconcile rollback ·" in term.plain and "model.config" in term.plain
    term.send("no")
    assert term.finish() == 1
    assert "rollback cancelled" in term.text and len(demo.generations()) == 2
    assert '"factor": 3.0' in (demo.model_dir / "config.json").read_text()
