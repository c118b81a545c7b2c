"""The command line itself: usage errors exit 1 (never argparse's 2, which reads as "changed"), help
lists every command, and each command's help describes its arguments with examples."""

from __future__ import annotations

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
    assert "N            the older generation's number" in out
    assert "M            the newer generation's number" in out


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


# quick_args: a plain `reconcile plan` or `apply` line read without argparse, to argparse's answer or
# not at all.
_WORDS = [
    "--spec",
    "--json",
    "--out",
    "--quiet",
    "--scheduled",
    "--textfile",
    "x.toml",
    "",
    "-",
    "-x",
    "--",
    "--spec=",
    "--spec=a=b",
    "--spec=--",
    "--json=1",
    "--sp",
    "--js",
    "-h",
    "--help",
    "--version",
    "plan",
    "a b",
    "-1",
    "--lock-timeout",
    "--lock-timeout=5",
    "2.5",
    "nan",
    "1_0",
    " 7 ",
    "--auto-approve",
    "--no-auto-rollback",
    "--reset-crash-loop",
    "plan.json",
    "--lock",
]


def _argparse_answer(words: list[str]) -> dict[str, object] | None:
    from reconcile.cli import _command_of, build_parser

    try:
        return vars(build_parser(_command_of(words)).parse_args(words))
    except SystemExit:
        return None


def _check_quick(words: list[str]) -> bool:
    from reconcile.cli import quick_args

    quick = quick_args(words)
    if quick is None:
        return False
    assert vars(quick) == _argparse_answer(words), words
    return True


@pytest.mark.parametrize(
    "words",
    [
        ["plan"],
        ["plan", "--spec", "specs/a.toml"],
        ["plan", "--spec=specs/a.toml", "--json"],
        ["plan", "--quiet", "--spec", "a.toml", "--scheduled", "--textfile", "/var/lib/x.prom"],
        ["plan", "--json", "--json", "--spec", "a", "--spec", "b"],  # repeated: the last value
        ["plan", "--out", "plan.json", "--spec", ""],
        ["plan", "--spec=--json"],
        ["plan", "--spec=a=b=c"],
        ["apply"],
        ["apply", "--scheduled", "--spec", "/etc/reconcile/gpu.toml", "--textfile", "/var/lib/r.prom"],
        ["apply", "--auto-approve", "--json", "--lock-timeout", "2.5", "--quiet", "--no-auto-rollback"],
        ["apply", "--lock-timeout= 7 ", "--reset-crash-loop", "--lock-timeout=1e3"],
    ],
)
def test_a_plain_plan_or_apply_line_is_read_as_argparse_reads_it(words: list[str]) -> None:
    assert _check_quick(words)


@pytest.mark.parametrize(
    "words",
    [
        ["plan", "--sp", "a.toml"],  # an abbreviation: argparse takes it, quick_args leaves it
        ["plan", "--spec"],
        ["plan", "--spec", "-x"],
        ["plan", "--json=yes"],
        ["plan", "-h"],
        ["plan", "x.toml"],
        ["plan", "--", "--spec", "a"],
        ["--spec", "a", "plan"],
        ["apply", "plan.json"],  # a positional: argparse
        ["apply", "--lock-timeout", "soon"],  # argparse says what is wrong with it
        ["apply", "--lock-timeout", "-1"],
        ["apply", "--out", "x"],  # plan's option, not apply's
        ["plan", "--spec=--"],  # argparse drops a "--" value (3.11: spec=[]); its answer varies by version
        ["apply", "--textfile=--", "--scheduled"],
        ["status", "--spec", "a"],
        [],
    ],
)
def test_any_other_line_is_left_to_argparse(words: list[str]) -> None:
    assert not _check_quick(words)


@pytest.mark.parametrize("command", ["plan", "apply"])
def test_quick_args_agrees_with_argparse_on_random_lines(command: str) -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=400, deadline=None)
    @given(st.lists(st.sampled_from(_WORDS) | st.text(max_size=6), max_size=6))
    def agree(tail: list[str]) -> None:
        _check_quick([command, *tail])

    agree()


def test_usage_errors_of_a_plan_line_still_come_from_argparse() -> None:
    run = _cli("plan", "--spec")
    assert run.returncode == 1
    assert "argument --spec: expected one argument" in run.stderr and run.stderr.startswith("usage:")
