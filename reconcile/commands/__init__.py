"""The commands, one module per command or family, each a thin function over the stages: load the
spec, call the stage, render, return the exit code.

Called only by `reconcile.cli` (`handler`), which imports the invoked command's module alone, so that
`reconcile --help` imports none of this and `reconcile plan` none of the other commands.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from reconcile.commands.common import Args

# A family's commands live in one module; every other command in the module of its own name.
_FAMILY = {
    "check": "status",
    "resume": "pause",
    "history": "generations",
    "diff": "generations",
    "rollback": "generations",
    "gc": "generations",
}


def handler(command: str) -> Callable[[Args], int]:
    """`cmd_<command>` of its module (imported now)."""
    module = f"reconcile.commands.{_FAMILY.get(command, command)}"
    __import__(module)
    fn: Callable[[Args], int] = getattr(sys.modules[module], "cmd_" + command)
    return fn
