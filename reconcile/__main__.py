"""`python -m reconcile` runs the CLI."""

import sys

from reconcile.cli import main

sys.exit(main())
