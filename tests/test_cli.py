"""The command line itself: usage errors exit 1 (never argparse's 2, which reads as "changed"), help
lists every command, and each command's help describes its arguments with examples."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from reconcile.cli import COMMANDS, main


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reconcile", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "specs/x.toml"],  # a forgotten --spec
        ["apply", "--lock-timeout", "abc"],
        ["rollback", "abc"],
        ["diff", "1"],
        ["bogus"],
        ["apply", "--no-such-flag"],
        ["timer"],
        [],
    ],
)
def test_a_usage_error_exits_1_with_one_error_line(argv: list[str]) -> None:
    run = _cli(*argv)
    assert run.returncode == 1, run.stderr
    assert run.stdout == ""
    assert "Traceback" not in run.stderr


def test_a_spec_path_given_without_spec_says_how_to_give_it() -> None:
    run = _cli("plan", "specs/x.toml")
    assert "unrecognized arguments: specs/x.toml (the spec is given with --spec PATH)" in run.stderr


def test_top_level_help_lists_every_command_and_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert f"\n    {name} " in out
    assert "130  interrupted" in out


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_help_has_examples(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([name, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: reconcile {name}")
    assert "\nexamples:\n  reconcile " + name in out


def test_diff_describes_its_two_generations(capsys: pytest.CaptureFixture[str]) -> None:
    main(["diff", "--help"])
    out = capsys.readouterr().out
    assert re.search(r"\n  N +the older generation's number", out), out  # the column: the longest option's
    assert re.search(r"\n  M +the newer generation's number", out), out


def test_only_the_invoked_command_gets_its_arguments() -> None:
    from reconcile.cli import build_parser

    parser = build_parser("plan")
    args = parser.parse_args(["plan", "--spec", "x.toml", "--json"])
    assert (args.command, args.spec, args.json) == ("plan", "x.toml", True)
    assert parser._subparsers is not None
    assert list(parser._subparsers._group_actions[0].choices or ()) == ["plan"]  # the others: not built


def test_version_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("reconcile ")


def test_a_usage_error_of_a_plan_line_is_argparse_s_one_line_exit_1() -> None:
    run = _cli("plan", "--spec")
    assert run.returncode == 1
    assert "argument --spec: expected one argument" in run.stderr and run.stderr.startswith("usage:")
