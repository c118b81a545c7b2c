"""reconcile's argparse classes: help at the terminal's width, and a usage error that exits 1.

Imported by reconcile.cli's build_parser.
"""

from __future__ import annotations

import argparse
import os
import sys


def _columns() -> int:
    """shutil.get_terminal_size().columns, without importing shutil (with bz2 and lzma: ~3-5 ms,
    which argparse's formatter pays on every run to validate each argument)."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            stdout = sys.__stdout__  # None without one: 80, as shutil falls back
            columns = os.get_terminal_size(stdout.fileno()).columns if stdout is not None else 0
        except (AttributeError, ValueError, OSError):
            columns = 0
        columns = columns or 80
    return columns


class Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's RawDescriptionHelpFormatter at the width it would pick itself (columns - 2)."""

    def __init__(
        self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None
    ) -> None:
        super().__init__(
            prog, indent_increment, max_help_position, _columns() - 2 if width is None else width
        )


class Parser(argparse.ArgumentParser):
    """argparse exits 2 on a usage error, which reconcile's exit codes (and a unit's
    SuccessExitStatus=2) read as "changed": a usage error is an error, exit 1."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        hint = ""
        if "unrecognized arguments" in message and ".toml" in message:
            hint = " (the spec is given with --spec PATH)"
        self.exit(1, f"{self.prog}: error: {message}{hint}\n")
