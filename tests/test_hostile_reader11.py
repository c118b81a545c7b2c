"""Issue 24's hostile reader, eleventh round: attacks on what the tenth round added first
(`shapes.outlandish_number`: where else a number from outside reaches the preflight's arithmetic
without it), found by reading docs/security.md and the code alone, each run for real (a model's own
files in a real directory, judged by the plan's preflight as `reconcile plan` runs it), each seen
succeeding on main before its fix unless its docstring says it was already refused.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# A model's own files (a hub repo's, or a source tree of another user's), judged by the plan's
# preflight as `reconcile plan` runs it (gather.inputs_from, then run_preflight); prints the errors.
PLAN = r"""
import json, sys
from pathlib import Path
from reconcile.preflight.gather import inputs_from, run_preflight
from tests.test_preflight import GOOD, load
from tests.test_preflight_weights import llama_spec, observed

tmp, doc, key, value = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
d = tmp / "model"
d.mkdir()
config = load("llama-3.1-8b")
if doc == "config.json:rope_scaling":
    config["rope_scaling"] = {"rope_type": "linear", key: json.loads(value)}
elif doc == "config.json":
    config[key] = json.loads(value)
else:
    (d / doc).write_text('{"%s": %s}' % (key, value))
(d / "config.json").write_text(json.dumps(config))
s = llama_spec(tmp, d, offline=True)
inputs = inputs_from(s, observed(d))
found = run_preflight(s, GOOD._replace(**{k: getattr(inputs, k) for k in (
    "model_config", "hf_quant_config", "tokenizer_config", "model_file_sizes", "model_files", "weights",
    "model_numbers") if hasattr(inputs, k)}))
for f in found:
    if f.severity == "error":
        print(f.rule, "|", f.message, flush=True)
"""


def _plan(tmp_path: Path, doc: str, key: str, value: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PLAN, str(tmp_path), doc, key, value],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )


@pytest.mark.parametrize("value", ['"1e400"', '"nan"', '"-inf"'])
def test_a_number_written_as_a_string_in_config_json_never_reaches_the_arithmetic(
    tmp_path: Path, value: str
) -> None:
    """Round 10's `outlandish_number` walks config.json's numbers; a string is not one, so it passes.
    main (seen): `"rope_scaling": {"rope_type": "linear", "factor": "1e400"}` (or "nan", "-inf") went
    through limits.derive_max_model_len's `float(params["factor"])` to infinity or NaN, and every plan
    (and apply) of that model ended in `OverflowError: cannot convert float infinity to integer` or
    `ValueError: cannot convert float NaN to integer`. Now a value the arithmetic takes must be a JSON
    number (as vLLM's own arithmetic needs): a string factor is the model's bad file, one finding naming
    the file and the key, and the plan goes on."""
    run = _plan(tmp_path, "config.json:rope_scaling", "factor", value)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert f"model.numbers | {tmp_path}/model/config.json: rope_scaling.factor is " in run.stdout, run.stdout


@pytest.mark.parametrize("value", ["-1e400", "-Infinity", "-1" + "0" * 400])
def test_a_tokenizer_config_number_no_model_has_is_one_finding_never_an_internal_error(
    tmp_path: Path, value: str
) -> None:
    """Round 10 tried tokenizer_config.json's `model_max_length` of 1e400 and NaN (refused: min() keeps
    the config's length) but walked only config.json and hf_quant_config.json. main (seen):
    `model_max_length: -1e400` (or -Infinity) wins the min() and every plan of that model ended in
    `OverflowError: cannot convert float infinity to integer` (limits.derive_max_model_len's
    `int(derived)`). Now tokenizer_config.json is walked like config.json: a number no model has makes
    it unused, and one finding names the file and the key."""
    run = _plan(tmp_path, "tokenizer_config.json", "model_max_length", value)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert f"model.numbers | {tmp_path}/model/tokenizer_config.json: model_max_length is " in run.stdout, run.stdout
