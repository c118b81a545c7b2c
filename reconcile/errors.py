"""Errors that reach the user as one clear line (the CLI prints them; never a traceback)."""

from __future__ import annotations


class ReconcileError(Exception):
    """Base: a message meant for the user, exit code 1."""


class SpecError(ReconcileError):
    """A bad spec: `FILE:LINE: section.key: what is wrong (what is allowed)`."""

    def __init__(self, file: str, line: int | None, key: str, message: str) -> None:
        self.file, self.line, self.key, self.message = file, line, key, message
        where = f"{file}:{line}" if line else file
        super().__init__(f"{where}: {key}: {message}" if key else f"{where}: {message}")


class ActionError(ReconcileError):
    """An action failed permanently; the message says what to do."""


class RetryableError(ReconcileError):
    """An action failed for a reason that may pass (a lock held, memory not yet freed)."""
