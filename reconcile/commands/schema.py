"""`reconcile schema [--json]`: the spec's reference, or its JSON Schema for editors."""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from reconcile.commands.common import Args


def cmd_schema(args: Args) -> int:
    if getattr(args, "json", False):
        import json

        from reconcile.plan.jsondata import spec_json_schema

        json.dump(spec_json_schema(), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    from reconcile.spec.loader import schema_text

    print(schema_text())
    return 0
