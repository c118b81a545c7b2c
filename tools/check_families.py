"""Cross-check reconcile's family table (reconcile/data/model_families.json) against transformers itself.

For every corpus config: the engine's figures on the raw config.json, and on the same config after
transformers' config class has filled in its defaults and derived fields (`AutoConfig.for_model(...)
.to_json_string(use_diff=False)`). They must be the same. Needs transformers (no torch); run it in a
scratch venv: python3 -m venv /tmp/tf && /tmp/tf/bin/pip install transformers && /tmp/tf/bin/python
tools/check_families.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from reconcile.vllm.kvgroups import kv_layout  # noqa: E402
from reconcile.vllm.kvspec import kinds_summary, layer_specs  # noqa: E402
from reconcile.vllm.limits import derive_max_model_len  # noqa: E402


def figures(config: dict[str, Any], tp: int) -> tuple[object, ...]:
    d = derive_max_model_len(config, "0.26.0")
    specs = layer_specs(config, tp=tp, max_model_len=d.default)
    layout = kv_layout(specs)
    return d.value, d.default, kinds_summary(specs), layout.kv_bytes_per_token, len(layout.groups)


def main() -> int:
    import transformers

    bad = 0
    for path in sorted((ROOT / "tests" / "data" / "model_configs").glob("*.json")):
        entry = json.loads(path.read_text())
        raw = entry["config"]
        rest = {k: v for k, v in raw.items() if k != "model_type"}
        resolved = json.loads(
            transformers.AutoConfig.for_model(raw["model_type"], **rest).to_json_string(False)
        )
        a, b = figures(raw, entry["tp"]), figures(resolved, entry["tp"])
        bad += a != b
        print(("ok  " if a == b else "DIFF"), path.stem, "" if a == b else f"raw {a} transformers {b}")
    print(f"transformers {transformers.__version__}: {bad} differences")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
