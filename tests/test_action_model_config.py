"""actions.model_config: config.json deep-merge patch, backup once, layout kept, crash-safe writes."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from actions.model_config import desired_config, patch_config
from reconcile.errors import ActionError
from reconcile.jsonmerge import deep_merge

ROOT = Path(__file__).resolve().parents[1]
ORIGINAL = {
    "architectures": ["NemotronHForCausalLM"],
    "hidden_size": 2688,
    "max_position_embeddings": 262144,
    "text_config": {"rope_theta": 10000.0, "vocab_size": 131072},
    "torch_dtype": "bfloat16",
}
ROPE = {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 262144}}


def _write(
    d: Path, obj: dict[str, Any] = ORIGINAL, indent: str | int | None = 2, newline: bool = True
) -> bytes:
    raw = (json.dumps(obj, indent=indent) + ("\n" if newline else "")).encode()
    (d / "config.json").write_bytes(raw)
    return raw


def _stamp(p: Path) -> tuple[int, int]:
    st = os.stat(p)
    return st.st_mtime_ns, st.st_ino


def test_first_patch_backs_up_the_original_bytes_and_merges(tmp_path: Path) -> None:
    original = _write(tmp_path)

    result = patch_config(str(tmp_path), ROPE)

    assert result.changed and "rope_parameters" in result.message
    assert (tmp_path / "config.json.bak").read_bytes() == original
    patched = json.loads((tmp_path / "config.json").read_bytes())
    assert patched == {**ORIGINAL, **ROPE}
    assert list(patched) == [*ORIGINAL, "rope_parameters"]  # unrelated keys keep their order


@pytest.mark.parametrize("indent", [2, 4, "\t"], ids=["2-spaces", "4-spaces", "tabs"])
@pytest.mark.parametrize("newline", [True, False], ids=["final-newline", "no-final-newline"])
def test_the_files_layout_is_kept(tmp_path: Path, indent: str | int, newline: bool) -> None:
    _write(tmp_path, indent=indent, newline=newline)

    patch_config(str(tmp_path), ROPE)

    assert (tmp_path / "config.json").read_bytes() == (
        json.dumps({**ORIGINAL, **ROPE}, indent=indent) + ("\n" if newline else "")
    ).encode()


def test_a_one_line_config_stays_one_line(tmp_path: Path) -> None:
    _write(tmp_path, indent=None, newline=False)

    patch_config(str(tmp_path), {"hidden_size": 1})

    assert (tmp_path / "config.json").read_bytes() == json.dumps({**ORIGINAL, "hidden_size": 1}).encode()


def test_patching_twice_changes_nothing(tmp_path: Path) -> None:
    _write(tmp_path)
    patch_config(str(tmp_path), ROPE)
    before = (_stamp(tmp_path / "config.json"), _stamp(tmp_path / "config.json.bak"))

    again = patch_config(str(tmp_path), ROPE)

    assert not again.changed and "already has the patch" in again.message
    assert (_stamp(tmp_path / "config.json"), _stamp(tmp_path / "config.json.bak")) == before


def test_nested_dicts_merge_and_other_values_replace(tmp_path: Path) -> None:
    _write(tmp_path)

    patch_config(str(tmp_path), {"text_config": {"rope_theta": 1e6}, "architectures": ["X"]})

    patched = json.loads((tmp_path / "config.json").read_bytes())
    assert patched["text_config"] == {"rope_theta": 1e6, "vocab_size": 131072}
    assert patched["architectures"] == ["X"]


def test_dropping_a_key_from_the_patch_restores_the_original_value(tmp_path: Path) -> None:
    _write(tmp_path)
    patch_config(str(tmp_path), {**ROPE, "max_position_embeddings": 1048576})

    result = patch_config(str(tmp_path), ROPE)

    assert result.changed
    assert json.loads((tmp_path / "config.json").read_bytes()) == {**ORIGINAL, **ROPE}


def test_an_empty_patch_restores_the_original_bytes(tmp_path: Path) -> None:
    # Written in a layout the renderer would not reproduce: the restore must be the backup's bytes.
    original = b'{"architectures": ["Toy"],\n "hidden_size": 64, "x": 1.50}'
    (tmp_path / "config.json").write_bytes(original)
    patch_config(str(tmp_path), ROPE)

    result = patch_config(str(tmp_path), {})

    assert result.changed and "restored the original" in result.message
    assert (tmp_path / "config.json").read_bytes() == original
    assert (tmp_path / "config.json.bak").read_bytes() == original


def test_an_unpatched_config_with_an_empty_patch_is_left_alone(tmp_path: Path) -> None:
    _write(tmp_path)
    before = _stamp(tmp_path / "config.json")

    result = patch_config(str(tmp_path), {})

    assert not result.changed and _stamp(tmp_path / "config.json") == before
    assert not (tmp_path / "config.json.bak").exists()


def test_the_backup_is_never_overwritten(tmp_path: Path) -> None:
    original = _write(tmp_path)
    patch_config(str(tmp_path), ROPE)
    (tmp_path / "config.json").write_text('{"someone": "edited it"}\n')

    result = patch_config(str(tmp_path), {"hidden_size": 7})

    assert result.changed
    assert (tmp_path / "config.json.bak").read_bytes() == original
    assert json.loads((tmp_path / "config.json").read_bytes()) == {**ORIGINAL, "hidden_size": 7}


def test_desired_config_is_the_merge_onto_the_backup(tmp_path: Path) -> None:
    _write(tmp_path)
    patch_config(str(tmp_path), {"hidden_size": 7})

    assert desired_config(str(tmp_path), ROPE) == {**ORIGINAL, **ROPE}
    assert deep_merge({"a": {"b": 1, "c": 2}}, {"a": {"c": 3}, "d": 4}) == {"a": {"b": 1, "c": 3}, "d": 4}


def test_a_missing_or_broken_config_is_an_error_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(ActionError, match=r"config\.json: missing"):
        patch_config(str(tmp_path), ROPE)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ActionError, match=r"config\.json: not valid JSON"):
        patch_config(str(tmp_path), ROPE)


_PATCH_SCRIPT = (
    "import json, sys; from actions.model_config import patch_config; "
    "patch_config(sys.argv[1], json.loads(sys.argv[2]))"
)


def _spawn(d: Path, patch: dict[str, Any]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", _PATCH_SCRIPT, str(d), json.dumps(patch)], cwd=ROOT)


def _writing(d: Path, stale: set[Path], before: tuple[int, int]) -> bool:
    """A run's own temp file exists beside config.json, or config.json itself is being rewritten."""
    return bool(set(d.glob(".config.json*.tmp")) - stale) or _stamp(d / "config.json") != before


@pytest.mark.slow
def test_sigkill_mid_write_never_leaves_broken_json_nor_a_wrong_backup(tmp_path: Path) -> None:
    huge = {**ORIGINAL, "padding": {f"key_{i}": [i, f"value {i}" * 3, {"n": i / 7}] for i in range(15_000)}}
    original = _write(tmp_path, huge)
    rng = random.Random(20240605)
    began = time.monotonic()
    assert _spawn(tmp_path, {"probe": 0}).wait(60) == 0
    full_run = time.monotonic() - began
    (tmp_path / "config.json").write_bytes(original)
    (tmp_path / "config.json.bak").unlink()
    killed_writing = 0

    for i in range(20):
        stale = set(tmp_path.glob(".config.json*.tmp"))  # left by an earlier kill; the action removes them
        before = _stamp(tmp_path / "config.json")

        child = _spawn(tmp_path, {**ROPE, "rope_parameters": {"factor": float(i)}, "round": i})
        if i % 2:
            time.sleep(rng.uniform(0, full_run))
        else:  # aim at the write itself
            deadline = time.monotonic() + full_run * 3
            while not _writing(tmp_path, stale, before) and time.monotonic() < deadline:
                time.sleep(0.001)
            time.sleep(rng.uniform(0, 0.003))
        mid_write = child.poll() is None and _writing(tmp_path, stale, before)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        killed_writing += mid_write and child.returncode == -signal.SIGKILL

        config = json.loads((tmp_path / "config.json").read_bytes())  # always valid JSON
        assert config.get("round") in (None, *range(i + 1))
        if (tmp_path / "config.json.bak").exists():
            assert (tmp_path / "config.json.bak").read_bytes() == original

    assert killed_writing >= 4  # the kills did land while a write was under way
    assert _spawn(tmp_path, ROPE).wait(60) == 0
    assert (tmp_path / "config.json.bak").read_bytes() == original
    assert json.loads((tmp_path / "config.json").read_bytes()) == {**huge, **ROPE}
    assert list(tmp_path.glob(".config.json*.tmp")) == []
