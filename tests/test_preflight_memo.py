"""reconcile.preflight.memo: remembered findings are the rules' own, value for value and type for type;
any change to the spec, the inputs or the rules' code is a miss; the entry is private, and a damaged
or foreign one is a miss; a warm converged plan then imports neither a rule module nor the engine."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from reconcile.preflight import memo
from reconcile.preflight.context import PreflightInputs
from reconcile.preflight.gather import rule_findings
from reconcile.spec.loader import load_spec
from reconcile.spec.view import decode, encode
from tests.test_preflight import GOOD

ROOT = Path(__file__).resolve().parent.parent
SPECS = [p for p in sorted((ROOT / "specs").glob("*.toml")) if p.name != "base.toml"]


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "reconcile" / "preflight"


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (1 == 1.0 == True is not enough here)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (dict, MappingProxyType)):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b) or (a != a and b != b)  # nan


def _remembered(spec: Any, inputs: PreflightInputs) -> tuple[Any, bool]:
    """(findings, whether the rules ran)."""
    ran = []

    def compute() -> Any:
        ran.append(1)
        return rule_findings(spec, inputs)

    return memo.remembered(spec, inputs, compute), bool(ran)


@pytest.mark.parametrize("path", SPECS, ids=[p.name for p in SPECS])
def test_a_hit_gives_the_rules_own_findings_for_every_bundled_spec(path: Path) -> None:
    from reconcile.spec.deployments import deployments

    for each in deployments(load_spec(str(path))):  # a spec with [deployments]: each one's view
        spec = each.loaded.spec
        direct = rule_findings(spec, GOOD)
        first, ran = _remembered(spec, GOOD)
        assert ran and _same(first, direct)
        again, ran = _remembered(spec, GOOD)
        assert not ran and _same(again, direct) and repr(again) == repr(direct)
        # The spec cache's plain twin of the same spec has the same key: a cold run's entry serves warm.
        view = decode(encode(spec))
        hit, ran = _remembered(view, GOOD)
        assert not ran and _same(hit, direct)


@pytest.mark.parametrize(
    "change",
    [
        {"vllm_version": "0.11.0"},
        {"vllm_version_source": "spec pin"},
        {"gpus": GOOD.gpus[:1] if GOOD.gpus else ()},
        {"venv_has_ninja": False},
        {"tool_parsers": frozenset({"hermes"})},
        {"model_config": {**(GOOD.model_config or {}), "max_position_embeddings": 4096}},
    ],
)
def test_any_change_of_the_inputs_is_a_miss(change: dict[str, Any]) -> None:
    spec = load_spec(str(ROOT / "specs" / "blackwell-2x5090.toml")).spec
    _remembered(spec, GOOD)
    changed = GOOD._replace(**change)
    found, ran = _remembered(spec, changed)
    assert ran and _same(found, rule_findings(spec, changed))


def test_a_change_of_the_spec_is_a_miss_even_between_equal_values_of_other_types(tmp_path: Path) -> None:
    base = (ROOT / "specs" / "cpu-demo.toml").read_text().replace("{spec_dir}", str(ROOT / "specs"))
    one, other = tmp_path / "a.toml", tmp_path / "b.toml"
    one.write_text(base.replace("max-num-seqs = 4", "max-num-seqs = 1"))
    other.write_text(base.replace("max-num-seqs = 4", "max-num-seqs = true"))
    a, b = load_spec(str(one)).spec, load_spec(str(other)).spec
    assert a.server is not None and b.server is not None
    assert a.server.args["max-num-seqs"] == b.server.args["max-num-seqs"]  # 1 == True
    _remembered(a, GOOD)
    found, ran = _remembered(b, GOOD)
    assert ran and _same(found, rule_findings(b, GOOD))


def test_an_edit_of_the_rules_code_or_data_is_a_miss(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = tmp_path / "code"
    shutil.copytree(ROOT / "reconcile" / "data", code)
    monkeypatch.setattr(memo, "_CODE", (str(code),))
    spec = load_spec(str(ROOT / "specs" / "blackwell-2x5090.toml")).spec
    _remembered(spec, GOOD)
    assert not _remembered(spec, GOOD)[1]
    table = code / "vllm_flags.json"
    table.write_text(table.read_text() + "\n")
    assert _remembered(spec, GOOD)[1]


def test_the_entry_is_private_and_a_damaged_or_loose_one_is_a_miss(cache: Path) -> None:
    os.umask(0)
    try:
        spec = load_spec(str(ROOT / "specs" / "blackwell-2x5090.toml")).spec
        _remembered(spec, GOOD)
    finally:
        os.umask(0o022)
    (entry,) = cache.iterdir()
    assert cache.stat().st_mode & 0o777 == 0o700 and entry.stat().st_mode & 0o777 == 0o600
    for body in (b"", b"\x00garbage", entry.read_bytes()[:-7]):
        entry.write_bytes(body)
        found, ran = _remembered(spec, GOOD)
        assert ran and _same(found, rule_findings(spec, GOOD))
    entry.chmod(0o644)
    assert _remembered(spec, GOOD)[1]


def test_findings_whose_evidence_the_memo_cannot_spell_are_computed_every_time(cache: Path) -> None:
    from reconcile.plan.records import Finding

    spec = load_spec(str(ROOT / "specs" / "cpu-demo.toml")).spec
    odd = (Finding("x.y", "warning", "m", "", {"at": object()}),)
    ran: list[int] = []

    def compute() -> tuple[Finding, ...]:
        ran.append(1)
        return odd

    for _ in range(2):
        assert memo.remembered(spec, GOOD, compute) == odd
    assert len(ran) == 2 and not cache.exists()


def test_a_warm_converged_plan_imports_no_rule_and_no_engine_and_says_the_same(tmp_path: Path) -> None:
    spec = ROOT / "specs" / "cpu-demo.toml"
    code = (
        f"import sys; from reconcile.cli import main; main(['plan', '--spec', {str(spec)!r}]); "
        "print(sorted(m for m in sys.modules if m.startswith(('reconcile.vllm.', 'reconcile.preflight.'))"
        # versions, weightfiles and (issue 14's) attention gather the inputs; no rule reads them
        " and m not in ('reconcile.vllm.versions', 'reconcile.vllm.weightfiles',"
        " 'reconcile.vllm.attention')))"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "home")}
    runs = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env) for _ in "abc"
    ]
    cold, warm, again = (r.stdout.rsplit("\n", 2) for r in runs)
    assert "reconcile.vllm.memory" in cold[1]  # the first plan ran the rules
    # paths and startable run on every plan (a path or an executable may change with nothing in the
    # memo's key); draining gives the launch its --shutdown-timeout (the server's identity).
    assert warm[1] == again[1] == str(
        ["reconcile.preflight.context", "reconcile.preflight.gather", "reconcile.preflight.memo",
         "reconcile.preflight.paths", "reconcile.preflight.startable", "reconcile.vllm.draining"]
    ), runs[1].stderr  # fmt: skip
    assert cold[0] == warm[0] == again[0]  # the plan's text
