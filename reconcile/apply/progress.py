"""What `reconcile apply` shows while it works: one updating line on a terminal (each step, then the
installer's output and vLLM's start-up phases), plain lines elsewhere, nothing with --quiet. Cleared
before the report. Created by the CLI; actions reach it through logging ("actions" loggers).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence

TYPE_CHECKING = False
if TYPE_CHECKING:
    import logging
    from typing import Any, TextIO

# Silent log while waiting for /health: warn after this long (RECONCILE_LOG_SILENCE_S overrides).
SILENCE_S = 120.0


class Terminal:
    """`step(text)` starts a step; `update(text)` is a transient detail of it. On a terminal both
    overwrite one line; elsewhere each is a full line."""

    def __init__(self, stream: TextIO, *, quiet: bool = False, live: bool | None = None) -> None:
        self.stream = stream
        self.quiet = quiet
        self.live = (stream.isatty() and os.environ.get("TERM") != "dumb") if live is None else live
        self.shown = False
        self.handler: logging.Handler | None = None  # what actions log, shown from the first step on

    def _emit(self, text: str) -> None:
        if self.quiet:
            return
        if self.live:
            import shutil  # only on a terminal

            width = max(20, shutil.get_terminal_size().columns - 1)
            self.stream.write("\r\x1b[K" + text.replace("\n", " ")[:width])
            self.shown = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def step(self, text: str) -> None:
        if self.handler is None:  # the executor steps right before each action: logs from then on
            self.handler = attach(self)
        self._emit(f"  … {text}")

    __call__ = step

    def update(self, text: str) -> None:
        self._emit(f"    {text}")

    def clear(self) -> None:
        """Before the report: a terminal's progress line goes away."""
        if self.live and self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False


def attach(terminal: Terminal) -> logging.Handler:
    """Show what actions log (the installer's lines) as progress; `detach` when done. logging is
    imported here, at an apply's first step: a no-op apply takes none and never imports it."""
    import logging

    class ToTerminal(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            terminal.update(record.getMessage())

    handler = ToTerminal(logging.INFO)
    logger = logging.getLogger("actions")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # what is shown here is not repeated by logging's last resort
    return handler


def detach(handler: logging.Handler) -> None:
    import logging

    logging.getLogger("actions").removeHandler(handler)


class StartupWatch:
    """Turns the readiness ticks (elapsed, the log's last lines) into vLLM's phase, and a warning when
    the log has been silent for a while (a hung download or compile looks exactly like that)."""

    def __init__(self, silence: float | None = None) -> None:
        env = os.environ.get("RECONCILE_LOG_SILENCE_S")
        self.silence = silence if silence is not None else float(env) if env else SILENCE_S
        self.last_line = ""
        self.changed_at = time.monotonic()
        self.phase = "starting"
        self.kv: str | None = None

    def text(self, elapsed: float, lines: Sequence[str]) -> str:
        from reconcile.vllm.startup import startup_phase

        last = lines[-1] if lines else ""
        now = time.monotonic()
        if last != self.last_line:
            self.last_line, self.changed_at = last, now
        phase, kv = startup_phase(lines)
        self.phase, self.kv = phase or self.phase, kv or self.kv
        shown = self.phase + (
            f"; KV cache {self.kv} tokens" if self.kv and "KV cache" not in self.phase else ""
        )
        text = f"waiting for /health {elapsed:.0f}s: {shown}"
        quiet_for = now - self.changed_at
        if quiet_for >= self.silence:
            text += f" (warning: the log has been silent for {quiet_for:.0f}s; last: {last[:100]})"
        return text


def readiness_progress(terminal: Terminal, every: float = 15.0) -> Callable[[Any], None]:
    """For actions.launching.wait_ready: live on a terminal; elsewhere a line when the phase changes,
    the log falls silent, or every `every` seconds."""
    watch = StartupWatch()
    said: list[tuple[str, bool, float]] = []  # (phase, warned, elapsed) of the last line written

    def show(tick: Any) -> None:
        text = watch.text(tick.elapsed, tick.lines or (tick.last_line,))
        if terminal.live:
            terminal.update(text)
            return
        now = (watch.phase, "(warning:" in text, float(tick.elapsed))
        if not said or now[:2] != said[-1][:2] or now[2] - said[-1][2] >= every:
            said[:] = [now]
            terminal.update(text)

    return show


@contextlib.contextmanager
def showing(stream: TextIO, *, quiet: bool) -> Iterator[Terminal]:
    """The progress of one apply: shown while it runs, cleared (on a terminal) before the report."""
    terminal = Terminal(stream, quiet=quiet)
    if quiet:  # the hub's download bars too (read when huggingface_hub is imported, later, by the action)
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    try:
        yield terminal
    finally:
        terminal.clear()
        if terminal.handler is not None:
            detach(terminal.handler)
