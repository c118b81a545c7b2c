"""The `reconcile` CLI run on a real pseudo-terminal: what a person at a terminal sees and types.

Imported by the confirmation and progress tests. Reads the terminal's output as it comes; `expect`
waits for a text, `send` types a line.
"""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import time
from collections.abc import Sequence


class Terminal:
    def __init__(self, argv: Sequence[str], *, cwd: str, env: dict[str, str] | None = None) -> None:
        master, slave = pty.openpty()
        self.master = master
        self.output = b""
        self.proc = subprocess.Popen(
            list(argv),
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=cwd,
            env={**(env or os.environ), "TERM": "xterm", "COLUMNS": "120"},
            start_new_session=True,
        )
        os.close(slave)

    def _read(self, wait: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], wait)
        if not ready:
            return True
        try:
            chunk = os.read(self.master, 65536)
        except OSError:  # EIO: the other side closed (the process exited)
            return False
        if not chunk:
            return False
        self.output += chunk
        return True

    @property
    def text(self) -> str:
        return self.output.decode(errors="replace")

    @property
    def plain(self) -> str:
        """What a person reads: colours dropped, each carriage return's overwritten text too."""
        text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", self.text).replace("\r\n", "\n")
        return "\n".join(line.rsplit("\r", 1)[-1] for line in text.split("\n"))

    def expect(self, needle: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.text:
            if time.monotonic() > deadline or not self._read(0.2):
                raise AssertionError(f"never saw {needle!r}; the terminal shows:\n{self.text}")

    def send(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\n")

    def finish(self, timeout: float = 180) -> int:
        deadline = time.monotonic() + timeout
        while self._read(0.2) and time.monotonic() < deadline:
            if self.proc.poll() is not None and not select.select([self.master], [], [], 0.1)[0]:
                break
        code = self.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        os.close(self.master)
        return code
