"""Quoting for what reconcile writes for systemd: unit settings, ExecStart= command lines (systemd.syntax(7),
systemd.service(5)) and EnvironmentFile= lines (systemd.exec(5)).

Called by actions.systemd_unit (the server's unit) and reconcile.unattended.timer (the timer's service). A
value the format cannot carry on its one line is refused (ActionError), never written.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from reconcile.errors import ActionError
from reconcile.safety.names import control_char

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def refuse_control(text: str, what: str) -> None:
    if (bad := control_char(text)) is not None:
        raise ActionError(
            f"{what} holds a control character ({bad}): {text[:60]!r}; it would start "
            "a line of its own in the generated file (remove it from the spec)"
        )


def exec_word(arg: str, what: str) -> str:
    """One ExecStart= word: double-quoted, with \\ and " escaped and % and $ doubled (no expansion)."""
    refuse_control(arg, what)
    escaped = arg.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{escaped}"'


def exec_command(argv: Sequence[str], what: str) -> str:
    """An ExecStart= value; the program is an absolute path (a leading - @ : + ! would be a prefix)."""
    if not argv or not argv[0].startswith("/"):
        raise ActionError(f"{what}: the program must be an absolute path, not {argv[:1]!r}")
    return " ".join(exec_word(a, what) for a in argv)


def setting(key: str, value: str, what: str) -> str:
    """`Key=value` for a setting that takes the rest of its line as is (a path, a description).

    systemd expands % specifiers there (doubled here), trims the ends (refused: the value would change)
    and joins a line that ends with a backslash to the next one (refused: it would swallow that line).
    """
    refuse_control(value, what)
    if value != value.strip() or value.endswith("\\"):
        raise ActionError(f"{what} {value[:60]!r} starts or ends with a space or a backslash")
    return f"{key}={value.replace('%', '%%')}"


def environment_line(key: str, value: str) -> str:
    """One EnvironmentFile= line, `KEY="value"`, escaped as systemd's parser reads double quotes."""
    if not ENV_NAME.fullmatch(key):
        raise ActionError(
            f"environment variable name {key[:60]!r}: letters, digits and _ only, not starting with a digit"
        )
    refuse_control(value, f"environment variable {key}")
    for ch in ("\\", '"', "$", "`"):
        value = value.replace(ch, "\\" + ch)
    return f'{key}="{value}"'
