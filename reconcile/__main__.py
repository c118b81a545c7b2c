"""`python -m reconcile` runs the CLI.

`-m` puts the current directory first on sys.path, and the CLI imports most modules lazily (json,
tomllib, subprocess...): run in a fleet repository under review (`validate` in CI) or by the timer's
unit (WorkingDirectory= the spec's directory), a json.py lying there would be imported, as root. So
that entry goes first, before anything else is imported (python -P does the same; the timer's unit
passes it too). A `reconcile/` package in the current directory would already have been imported in
place of this one: run the `reconcile` console script, or `python -P -m reconcile`, there.
"""

import os
import sys

SAFE_PATH = getattr(sys.flags, "safe_path", False)  # python -P (3.11+): the entry was never added
if not SAFE_PATH and sys.path and os.path.abspath(sys.path[0] or os.curdir) == os.getcwd():
    del sys.path[0]

from reconcile.cli import main  # noqa: E402  (after the current directory left sys.path)

sys.exit(main())
