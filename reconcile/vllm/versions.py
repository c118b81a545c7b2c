"""Version strings as comparable numbers: "580.95.05" -> (580, 95, 5), "13.0" -> (13, 0).

Shared by the planner (driver, nvcc), the preflight and the health probe (the reasoning field).
"""

from __future__ import annotations

import re

_NUMBER = r"\d+"  # compiled on first use (by re's cache), not on import


def numbers(text: str | None) -> tuple[int, ...]:
    """Every run of digits, in order; () when there is none."""
    return tuple(int(n) for n in re.findall(_NUMBER, text or ""))
