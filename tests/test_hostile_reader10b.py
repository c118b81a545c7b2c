"""Issue 24's hostile reader, tenth round, classes 4-6 (bounded network reads, output is data, state
never wedges) and the process-ownership rules: attacks on what the ninth round added first (the hub
listing's size check `shapes.listed_size`, `statefiles.unreadable`, the plan's server row), found by
reading docs/security.md and the code alone, each run for real (a hub listening on loopback, real
files in a real state directory), each seen succeeding on main before its fix unless its docstring
says it was already refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_hostile_reader9b import _Hub, with_hub  # a hub listing a file of the size _Hub.SIZE

COMMIT = "a" * 40
HUGE = "1" + "0" * 400  # a JSON integer: valid, a count >= 0, and past every float


# The plan's preflight as `reconcile plan` runs it (gather.inputs_from, then run_preflight with two
# GPUs), on a Llama whose weights are not downloaded yet, so the weights' size is the hub's listing;
# twice (the second from the cache, as every later plan), then apply's own listing of the download.
PLAN = r"""
import sys
from pathlib import Path
from reconcile.preflight.gather import inputs_from, run_preflight
from tests.test_preflight import GOOD, load
from tests.test_preflight_weights import llama_dir, llama_spec, observed

tmp = Path(sys.argv[1])
d = llama_dir(tmp)
s = llama_spec(tmp, d, repo="o/m")
for _ in range(2):
    inputs = inputs_from(s, observed(d))
    found = run_preflight(s, GOOD._replace(
        weights=inputs.weights, model_config=load("llama-3.1-8b"), hf_quant_config=None,
        model_file_sizes={}, model_files=frozenset(),
    ))
    print("plan:", inputs.weights, len(found), flush=True)
from actions.model import _listing, _refuse_past_free_space
from reconcile.errors import ActionError
try:  # as the download asks, then checks the listed files against the model dir's free space
    commit, files = _listing("o/m", "main", None)
    _refuse_past_free_space("o/m", str(d), {n: f.size for n, f in files.items()})
    print("download: fits", flush=True)
except ActionError as exc:
    print("download:", exc, flush=True)
"""


def _run_plan(tmp_path: Path, size: str, offline: bool = False) -> subprocess.CompletedProcess[str]:
    _Hub.SIZE = size
    return with_hub(PLAN, str(tmp_path), offline=offline)


def test_a_hub_listing_size_no_file_can_have_is_the_hubs_bad_answer_never_an_internal_error(
    tmp_path: Path,
) -> None:
    """Round 9's `shapes.listed_size` refused sizes that are not counts (-5, "x", 1e400, [1]) but took
    any integer >= 0. main (seen): a hub (or mirror at HF_ENDPOINT) that lists model.safetensors with a
    401-digit size (valid JSON, a count) had it cached under <state_dir>/cache/hub/ (its reader's COUNT
    has no maximum), and every later plan -- offline too, from the cache -- ended in `OverflowError:
    integer division result too large for a float` in the memory rule's table (budget.size); apply's
    download ended the same way in its free-space check (untrusted.human) and its deadline. Now a size
    past what a file can hold (off_t: 2**63 - 1, `shapes.SIZE_MAX`) is not a size: the listing is the
    hub's bad answer, named, nothing cached, the plan goes on without the hub's weights size."""
    run = _run_plan(tmp_path, HUGE)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert [line.split(" ", 2)[:2] for line in lines[:2]] == [["plan:", "None"]] * 2, run.stdout
    assert lines[2].startswith("download: o/m@main: the hub's listing gives model.safetensors a size "), lines
    assert "not a size" in lines[2], lines
    cache = tmp_path / "state" / "cache" / "hub"
    assert [p.name for p in cache.rglob("*.json")] == [], "a size its reader must refuse was cached"


def test_a_cached_listing_with_a_size_no_file_can_have_is_moved_aside_and_the_plan_goes_on(
    tmp_path: Path,
) -> None:
    """The same listing already cached (written by main before the fix, or damaged): main (seen) read
    it back as valid (COUNT) and every plan, offline ones too, ended in the OverflowError. Now its reader
    (`HUB_LISTING`'s sizes are `SIZE`) moves it aside with one line, and the plan goes on."""
    repo_dir = tmp_path / "state" / "cache" / "hub" / "o__m"
    repo_dir.mkdir(parents=True, mode=0o700)
    for name in (f"{COMMIT}.json", "main.json"):
        data = {"repo": "o/m", "revision": "main", "commit": COMMIT, "sizes": {"model.safetensors": 0}}
        raw = json.dumps(data).replace('"model.safetensors": 0', f'"model.safetensors": {HUGE}')
        (repo_dir / name).write_text(raw)
        os.chmod(repo_dir / name, 0o600)
    run = _run_plan(tmp_path, "1000", offline=True)
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert lines[0].startswith("plan: None"), run.stdout
    assert any(".corrupt-" in p.name for p in repo_dir.iterdir()), list(repo_dir.iterdir())


# The end of a script that judges the model dir `d` (under `tmp`) by the plan's preflight, as `reconcile
# plan` runs it (gather.inputs_from, then run_preflight), and prints its errors and warnings.
PREFLIGHT_FINDINGS = """s = llama_spec(tmp, d, offline=True)
inputs = inputs_from(s, observed(d))
found = run_preflight(s, GOOD._replace(**{k: getattr(inputs, k) for k in (
    "model_config", "hf_quant_config", "tokenizer_config", "model_file_sizes", "model_files", "weights",
    "model_numbers") if hasattr(inputs, k)}))
for f in found:
    if f.severity in ("error", "warning"):
        print(f.rule, "|", f.message, flush=True)
"""

# A model's own JSON (a hub repo's config.json, or a source tree of another user's), judged by the plan's
# preflight as `reconcile plan` runs it, before the weights are there (so the index's total counts).
CONFIG = (
    r"""
import json, sys
from pathlib import Path
from reconcile.preflight.gather import inputs_from, run_preflight
from tests.test_preflight import GOOD, load
from tests.test_preflight_weights import llama_spec, observed

tmp, where, value = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
d = tmp / "model"
d.mkdir()
config = json.dumps(load("llama-3.1-8b"))
if where == "total_size":
    index = '{"metadata": {"total_size": %s}, "weight_map": {}}' % value
    (d / "model.safetensors.index.json").write_text(index)
else:
    config = config.replace(f'"{where}": ', f'"{where}": {value}, "was_{where}": ', 1)
(d / "config.json").write_text(config)
"""
    + PREFLIGHT_FINDINGS
)


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ("hidden_size", "1e400"),
        ("num_attention_heads", "1e400"),
        ("hidden_size", "NaN"),
        ("intermediate_size", "-Infinity"),
        ("total_size", "1e400"),
        ("total_size", HUGE),
    ],
)
def test_a_number_no_model_has_in_the_models_own_files_is_one_finding_never_an_internal_error(
    tmp_path: Path, where: str, value: str
) -> None:
    """A model's config.json is data from outside (a hub repo's publisher, a source tree's owner). main
    (seen): `hidden_size: 1e400` or `num_attention_heads: 1e400` (JSON's parser makes it infinity),
    `NaN` or `-Infinity` ended the preflight's rules in `OverflowError: cannot convert float infinity to
    integer` or `ValueError: cannot convert float NaN to integer`, and model.safetensors.index.json's
    `total_size` of 1e400 or a 401-digit integer did the same in index_total and the memory table: every
    plan (and apply, whose plan it is) of that model an internal error. Now a number no model has
    (not finite, or past shapes.SIZE_MAX either way) makes that file unused and is one finding naming
    the file and the key; the index's total past SIZE_MAX is no total."""
    run = subprocess.run(
        [sys.executable, "-c", CONFIG, str(tmp_path), where, value],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
    if where != "total_size":
        assert f"model.numbers | {tmp_path}/model/config.json: {where} is " in run.stdout, run.stdout
        assert "a number no model has" in run.stdout, run.stdout


def test_the_configs_transformers_writes_for_the_served_hybrids_are_a_models_numbers() -> None:
    """transformers writes Mamba-2's `time_step_limit` as [0.0, Infinity] (its default for Mamba2, Bamba,
    Falcon-H1, Granite-4.0-H and NemotronH), and the lab served those configs: the check above must not
    take a real model's open bound for a number no model has (it refused every one of them as
    `model.numbers` before OPEN_BOUNDS). Infinity anywhere the rules read is still refused."""
    from reconcile.safety.shapes import outlandish_number

    rows = sorted((Path(__file__).resolve().parent / "data" / "served_issue28").glob("*.json"))
    with_bound = 0
    for row in rows:
        config = json.loads(row.read_text())["config"]
        with_bound += "Infinity" in json.dumps(config.get("time_step_limit"))
        assert outlandish_number(config) is None, row.name
    assert with_bound >= 4  # nemotronh-pad, granite-h, falcon-h1, mamba-kvbytes-graphs
    nemotron = json.loads((rows[0].parent / "nemotronh-pad.json").read_text())["config"]
    assert outlandish_number({**nemotron, "hidden_size": float("inf")}) == ("hidden_size", float("inf"))
