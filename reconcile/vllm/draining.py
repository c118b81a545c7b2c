"""How vLLM stops, and the drain a launch asks for: with `--shutdown-timeout N` (0.18+) SIGTERM closes
the listening socket and lets in-flight requests finish for up to N s; without it they are aborted
(a clean `[DONE]`, finish_reason "abort"). Used by actions.launching and the preflight's drain rule.
"""

from __future__ import annotations

from reconcile.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

FLAG = "shutdown-timeout"
FIRST_RELEASE = (0, 18, 0)
# What vLLM takes to exit once the last request is done (engine core, workers, CUDA teardown): on an
# H200 with 0.26.0, 8 streams of ~6.6 s left were done and the process gone 11.4 s after SIGTERM.
EXIT_MARGIN = 10.0


class Drain(Record):
    """The drain a launch gets: `seconds` (0: abort), from where ("args", "default", "unsupported")."""

    seconds: int
    source: str
    stop_timeout: float

    @property
    def flag(self) -> list[str]:
        """What reconcile adds to the command line (nothing when the spec's args say it, or vLLM lacks it)."""
        return [f"--{FLAG}", str(self.seconds)] if self.source == "default" and self.seconds > 0 else []

    @property
    def cut(self) -> bool:
        """Whether stop_timeout ends in SIGKILL before the drain and vLLM's exit can be done."""
        return self.seconds > 0 and self.stop_timeout < self.seconds + EXIT_MARGIN

    def describe(self) -> str:
        if self.source == "unsupported":
            return "no drain (this vLLM has no --shutdown-timeout): a stop aborts in-flight requests"
        if self.seconds <= 0:
            return "no drain (--shutdown-timeout 0): a stop aborts in-flight requests"
        whose = (
            "the spec's args"
            if self.source == "args"
            else f"reconcile's default: stop_timeout {self.stop_timeout:g}s - {EXIT_MARGIN:g}s"
        )
        return f"a stop drains in-flight requests up to {self.seconds}s (--shutdown-timeout, {whose})"


def spec_value(args: Mapping[str, object]) -> object:
    """args.shutdown-timeout (or shutdown_timeout) as the spec writes it; None when absent."""
    for key in (FLAG, FLAG.replace("-", "_")):
        if key in args:
            return args[key]
    return None


def drain(args: Mapping[str, object], stop_timeout: float, release: tuple[int, int, int] | None) -> Drain:
    """The drain for a server with these args and stop_timeout, on vLLM `release` (None: unknown, taken
    as one that has the flag: reconcile's supported vLLMs do)."""
    given = spec_value(args)
    if given is not None and not isinstance(given, bool):
        try:
            return Drain(max(0, int(float(str(given)))), "args", stop_timeout)
        except ValueError:
            return Drain(0, "args", stop_timeout)
    if release is not None and release < FIRST_RELEASE:
        return Drain(0, "unsupported", stop_timeout)
    return Drain(max(0, int(stop_timeout - EXIT_MARGIN)), "default", stop_timeout)
