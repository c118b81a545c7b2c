"""Issue 24's hostile reader, eleventh round: attacks on what the tenth round added first
(`shapes.outlandish_number`: where else a number from outside reaches the preflight's arithmetic
without it), found by reading docs/security.md and the code alone, each run for real (a model's own
files in a real directory, judged by the plan's preflight as `reconcile plan` runs it), each seen
succeeding on main before its fix unless its docstring says it was already refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_hostile_reader10b import PREFLIGHT_FINDINGS

# A model's own files (a hub repo's, or a source tree of another user's), judged by the plan's
# preflight as `reconcile plan` runs it (gather.inputs_from, then run_preflight); prints errors and warnings.
PLAN = (
    r"""
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
"""
    + PREFLIGHT_FINDINGS
)


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
    named = f"model.numbers | {tmp_path}/model/tokenizer_config.json: model_max_length is "
    assert named in run.stdout, run.stdout


# A hub (or a mirror at HF_ENDPOINT) listening on loopback whose answer's commit sha is SHA; the listing
# as apply's download asks for it (actions.model._listing), through huggingface_hub's own client.
HUB = r"""
import json, os, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SHA = json.loads(sys.argv[1])

class Hub(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        siblings = [{"rfilename": "model.safetensors", "size": 5}]
        body = json.dumps({"id": "o/m", "sha": SHA, "siblings": siblings})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body.encode())))
        self.end_headers()
        self.wfile.write(body.encode())

hub = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
threading.Thread(target=hub.serve_forever, daemon=True).start()
os.environ["HF_ENDPOINT"] = f"http://127.0.0.1:{hub.server_address[1]}"
from actions.model import _listing
from reconcile.errors import ActionError
try:
    print("listed:", json.dumps(_listing("o/m", "main", None)[0]), flush=True)
except ActionError as exc:
    print("refused:", exc, flush=True)
"""


@pytest.mark.parametrize(("sha", "taken"), [("a" * 40, True), ("a" * 40 + "\n", False)])
def test_the_hubs_commit_sha_is_forty_hex_digits_and_nothing_after_them(
    tmp_path: Path, sha: str, taken: bool
) -> None:
    """actions.model checked the hub's commit sha with `re.match(r"^[0-9a-f]{40}$")`, whose `$` also
    matches before a final newline. main (seen): a hub answering `"sha": "<40 hex>\\n"` had it taken as
    the commit, newline and all, for the download's revision, the store's snapshot name and the
    listing cache's file name. Now the patterns that judge names and commits from outside end in `\\Z`:
    that answer is refused as a hub answering without a commit sha; a plain sha is still taken."""
    run = run_hub(tmp_path, HUB, sha)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
    if taken:
        assert run.stdout == f"listed: {json.dumps(sha)}\n", run.stdout
    else:
        assert run.stdout.startswith("refused: o/m@main: the hub answered without a commit sha"), run.stdout


def run_hub(tmp_path: Path, script: str, sha: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`script` (HUB, or its listener with another question) run with the hub answering `sha`."""
    return subprocess.run(
        [sys.executable, "-c", script, json.dumps(sha), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={
            **os.environ,
            "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
            "HF_HOME": str(tmp_path),
        },
    )
