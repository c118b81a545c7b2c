"""What the plan says about facts another place owns: a model source's config.json before the copy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tests.apply_support import REPO, Demo


def test_a_plan_from_nothing_shows_the_sources_value_as_the_old_one(demo: Demo, tmp_path: Path) -> None:
    source = tmp_path / "source"
    shutil.copytree(REPO / "specs" / "demo-model", source)
    config = json.loads((source / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    (source / "config.json").write_text(json.dumps(config))

    def from_source(doc: Any) -> None:
        for section in ("venv", "server"):
            del doc[section]
        doc["model"]["source"] = str(source)

    demo.write_spec(from_source)
    data = demo.cli("plan", "--json").json()
    [entry] = [r for r in data["resources"] if r["resource"] == "model.config"]
    assert entry["diffs"][0]["old"] == {"rope_type": "default", "rope_theta": 10000.0}  # not (absent)
