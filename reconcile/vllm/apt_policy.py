"""`apt-cache policy` output as data: which packages apt's lists can install. A pure parser, shared by
the apt probe (does apt know a package the plan promises to install?) and the apt action.
"""

from __future__ import annotations

import re


def policy_table(text: str) -> dict[str, tuple[str | None, tuple[str, ...]]]:
    """`apt-cache policy` output -> {name: (candidate or None, versions in the version table)}."""
    result: dict[str, tuple[str | None, tuple[str, ...]]] = {}
    name: str | None = None
    candidate: str | None = None
    versions: list[str] = []
    in_table = False

    def flush() -> None:
        if name is not None:
            result[name] = (candidate, tuple(versions))

    for line in text.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" ") and line.endswith(":"):
            flush()
            name, candidate, versions, in_table = line[:-1], None, [], False
        elif name is None:
            raise ValueError(f"cannot parse `apt-cache policy` output near {line!r}:\n{text[:2000]}")
        elif line.strip().startswith("Candidate:"):
            value = line.split(":", 1)[1].strip()
            candidate = None if value == "(none)" else value
        elif line.strip() == "Version table:":
            in_table = True
        elif in_table and (line.startswith(" *** ") or re.match(r"^ {5}\S", line)):
            versions.append(line[5:].split()[0])
    flush()
    return result
