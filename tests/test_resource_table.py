"""docs/architecture.md's resource table is the one the declarations (reconcile/resources/) make."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_documented_table_is_the_declared_one() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "resource_table.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
