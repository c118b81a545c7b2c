"""Issue 18 on a real machine: dpkg's status file read directly (probes.dpkg_status) against the real
dpkg-query, for every installed package, its arch-qualified name and two unknown names.

Needs only the standard library and this checkout; on the GPU lab, run from the repository root:
`python3 tools/dpkg_status_check.py` (prints the counts and `equal True`; exit 1 when they differ).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from probes import dpkg_status
from probes.apt import DPKG_FORMAT, parse_dpkg_query


def main() -> int:
    with open(os.path.join(dpkg_status.ADMINDIR, "status"), errors="replace") as f:
        text = f.read()
    names = sorted(set(re.findall(r"^Package: (\S+)$", text, re.MULTILINE)))
    archs = dict(re.findall(r"^Package: (\S+)\n(?:.*\n)*?Architecture: (\S+)", text, re.MULTILINE))
    asked = [*names, *(f"{n}:{archs[n]}" for n in names if n in archs), "no-such-package-here", "Bash"]
    done = subprocess.run(
        ["dpkg-query", "-W", f"-f={DPKG_FORMAT}", *asked],
        capture_output=True,
        text=True,
        env={**os.environ, "LC_ALL": "C"},
    )
    real = parse_dpkg_query(done.stdout, done.stderr, asked)
    direct = dpkg_status.query(asked)
    equal = direct is not None and parse_dpkg_query(*direct, asked) == real
    print(f"usable {dpkg_status.usable()} packages {len(names)} names asked {len(asked)}")
    print(f"equal {equal}")
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
