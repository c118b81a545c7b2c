"""vLLM flags by version: the shipped table, its generator, and the version mapping (vllm-facts.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from reconcile.vllm import flags
from reconcile.vllm.flags import canonical, flag_exists, flag_history, release, version_from_pin

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = Path("/work/shared/reference/vllm-flags")


def test_shipped_table_is_what_the_generator_makes_from_the_reference_lists(tmp_path: Path) -> None:
    if not REFERENCE.is_dir():
        pytest.skip("the reference flag lists are not on this machine")
    out = tmp_path / "table.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_flags_table.py"), str(REFERENCE), str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "flags over 24 releases" in done.stdout
    assert out.read_text() == Path(flags.TABLE_PATH).read_text()


def test_shipped_table_lists_every_release_from_0_10_to_0_33() -> None:
    data = json.loads(Path(flags.TABLE_PATH).read_text())
    assert data["versions"][0] == "0.10.0" and data["versions"][-1] == "0.33.0"
    assert data["flags"]["--rope-scaling"] == [["0.10.0", "0.11.0"]]


@pytest.mark.parametrize(
    ("flag", "version", "expected"),
    [
        ("--rope-scaling", "0.11.0", True),
        ("--rope-scaling", "0.11.1", False),  # removed in 0.11.1 (vllm-facts.md)
        ("--rope-theta", "0.26.0rc1", False),  # the article's nightly
        ("--swap-space", "0.17.0", True),
        ("--swap-space", "0.18.0", False),
        ("--reasoning-parser-plugin", "0.11.0", False),
        ("--reasoning-parser-plugin", "0.11.1", True),
        ("--shutdown-timeout", "0.17.0", False),
        ("--shutdown-timeout", "0.18.1", True),
        ("--hf-overrides", "0.10.0", True),
        ("--hf-overrides", "0.33.0", True),
    ],
)
def test_flag_exists_follows_the_release_lists(flag: str, version: str, expected: bool) -> None:
    assert flag_exists(flag, version) is expected


def test_short_aliases_underscores_and_bare_names_are_the_long_flag() -> None:
    assert canonical("-tp") == "--tensor-parallel-size"
    assert canonical("tensor_parallel_size") == "--tensor-parallel-size"
    assert canonical("max-model-len") == "--max-model-len"
    assert flag_exists("-tp", "0.10.0") is True
    assert flag_exists("max_model_len", "0.26.0") is True


def test_no_form_of_a_boolean_flag_counts_as_the_flag() -> None:
    assert flag_exists("--no-enable-prefix-caching", "0.26.0") is True


def test_release_candidates_and_dev_builds_count_as_their_release() -> None:
    assert release("0.26.0rc1") == (0, 26, 0)
    assert release("0.26.1.dev5+g1a2b3c4") == (0, 26, 1)
    assert release("v0.11.1") == (0, 11, 1)
    assert release("nightly") is None
    # 0.26.0rc1 already lacks what 0.26.0 lacks (the article's "vLLM 0.26 removed these").
    assert flag_exists("--swap-space", "0.26.0rc1") is False
    assert flag_exists("--reasoning-parser-plugin", "0.11.1rc2") is True


def test_between_listed_releases_an_unsettled_flag_is_unknown() -> None:
    # The lists skip 0.21-0.24: flags that differ between 0.20.0 and 0.25.0 cannot be decided there.
    changed = [f for f, runs in flags.table().runs.items() if runs[0][0] == "0.25.0"]
    assert changed, "the lists have flags that first appear in 0.25.0"
    assert flag_exists(changed[0], "0.22.0") is None
    assert flag_exists("--max-model-len", "0.22.0") is True


def test_outside_the_lists_only_what_can_be_known_is_answered() -> None:
    assert flag_exists("--max-model-len", "0.9.2") is None
    assert flag_exists("--max-model-len", "0.40.0") is True
    assert flag_exists("--rope-scaling", "0.40.0") is False
    assert flag_exists("--made-up-flag", "0.40.0") is None
    assert flag_exists("--made-up-flag", "0.26.0") is False


def test_flag_history_names_the_release_that_added_and_removed_it() -> None:
    assert flag_history("--rope-scaling") == ("0.10.0", "0.11.1")
    assert flag_history("--swap-space") == ("0.10.0", "0.18.0")
    assert flag_history("--reasoning-parser-plugin") == ("0.11.1", None)
    assert flag_history("--shutdown-timeout") == ("0.18.0", None)
    assert flag_history("--made-up-flag") == (None, None)


def test_a_flag_with_a_gap_is_absent_inside_the_gap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "0.10.0.txt").write_text("--a\n--b\n")
    (lists / "0.11.0.txt").write_text("--a\n")
    (lists / "0.12.0.txt").write_text("--a\n--b\n")
    table = tmp_path / "table.json"
    subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_flags_table.py"), str(lists), str(table)], check=True
    )
    assert json.loads(table.read_text())["flags"]["--b"] == [["0.10.0", "0.10.0"], ["0.12.0", "0.12.0"]]
    monkeypatch.setattr(flags, "TABLE_PATH", table)
    flags.table.cache_clear()
    try:
        assert [flag_exists("--b", v) for v in ("0.10.0", "0.11.0", "0.12.0")] == [True, False, True]
        assert flag_history("--b") == ("0.10.0", None)
    finally:
        flags.table.cache_clear()


def test_the_version_a_pin_names() -> None:
    assert version_from_pin("==0.26.0") == "0.26.0"
    assert version_from_pin(">=0.26.0rc1") == "0.26.0rc1"
    assert version_from_pin(">=0.20,<0.27") == "0.20"
    assert version_from_pin("*") is None
    assert version_from_pin("==0.26.*") is None
