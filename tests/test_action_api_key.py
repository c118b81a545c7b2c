"""The API key action on real files: generated once, mode and owner kept right, the key never shown."""

from __future__ import annotations

import logging
import os
import pwd
import stat
from pathlib import Path

import pytest

from actions.api_key import ensure_key
from reconcile.errors import ActionError
from reconcile.spec.models import ApiKey

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def _me() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_missing_key_is_generated_with_mode_0600(tmp_path: Path) -> None:
    key_file = tmp_path / "vllm-api.key"

    result = ensure_key(ApiKey(file=str(key_file), owner=_me()))

    assert result.changed
    assert _mode(key_file) == 0o600
    key = key_file.read_text()
    assert key.endswith("\n") and len(key.strip()) == 43  # secrets.token_urlsafe(32)
    assert key.strip() not in result.message


def test_keys_differ_between_machines(tmp_path: Path) -> None:
    a, b = tmp_path / "a.key", tmp_path / "b.key"
    ensure_key(ApiKey(file=str(a), owner=_me()))
    ensure_key(ApiKey(file=str(b), owner=_me()))
    assert a.read_text() != b.read_text()


def test_a_second_call_changes_nothing_and_keeps_the_key(tmp_path: Path) -> None:
    key_file = tmp_path / "vllm-api.key"
    spec = ApiKey(file=str(key_file), owner=_me())
    ensure_key(spec)
    key, inode = key_file.read_bytes(), key_file.stat().st_ino

    again = ensure_key(spec)

    assert not again.changed
    assert again.message.startswith(f"{key_file} already holds a key, mode 0600")
    assert key_file.read_bytes() == key
    assert key_file.stat().st_ino == inode


def test_a_loose_mode_is_fixed_without_touching_the_key(tmp_path: Path) -> None:
    key_file = tmp_path / "vllm-api.key"
    key_file.write_text("the-operators-own-key\n")
    key_file.chmod(0o644)

    result = ensure_key(ApiKey(file=str(key_file), owner=_me()))

    assert result.changed and "mode 0644 -> 0600" in result.message
    assert _mode(key_file) == 0o600
    assert key_file.read_text() == "the-operators-own-key\n"
    assert "the-operators-own-key" not in result.message


def test_the_spec_mode_is_applied(tmp_path: Path) -> None:
    key_file = tmp_path / "k"
    ensure_key(ApiKey(file=str(key_file), owner=_me(), mode="0640"))
    assert _mode(key_file) == 0o640


def test_a_missing_parent_directory_is_created_0700(tmp_path: Path) -> None:
    key_file = tmp_path / "secrets" / "vllm" / "api.key"

    ensure_key(ApiKey(file=str(key_file), owner=_me()))

    assert _mode(key_file.parent) == 0o700
    assert _mode(key_file) == 0o600


def test_an_empty_key_file_gets_a_key(tmp_path: Path) -> None:
    key_file = tmp_path / "k"
    key_file.touch()

    result = ensure_key(ApiKey(file=str(key_file), owner=_me()))

    assert result.changed and "was empty" in result.message
    assert len(key_file.read_text().strip()) == 43


def test_a_symlink_at_the_key_path_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    elsewhere = tmp_path / "shadow"
    elsewhere.write_text("not a key\n")
    elsewhere.chmod(0o644)
    key_file = tmp_path / "k"
    key_file.symlink_to(elsewhere)

    with pytest.raises(ActionError, match="symlink"):
        ensure_key(ApiKey(file=str(key_file), owner=_me()))

    assert _mode(elsewhere) == 0o644 and elsewhere.read_text() == "not a key\n"


def test_an_unknown_owner_fails_and_writes_nothing(tmp_path: Path) -> None:
    key_file = tmp_path / "k"

    with pytest.raises(ActionError, match=r"reconcile-no-such-user.*does not exist"):
        ensure_key(ApiKey(file=str(key_file), owner="reconcile-no-such-user"))

    assert not key_file.exists()


@pytest.mark.root
@ROOT_ONLY
def test_the_owner_nobody_is_applied_to_file_and_created_directory(tmp_path: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    key_file = tmp_path / "vllm" / "api.key"

    created = ensure_key(ApiKey(file=str(key_file), owner="nobody"))

    assert created.changed
    assert (key_file.stat().st_uid, key_file.stat().st_gid) == (nobody.pw_uid, nobody.pw_gid)
    assert (key_file.parent.stat().st_uid, key_file.parent.stat().st_gid) == (nobody.pw_uid, nobody.pw_gid)
    assert not ensure_key(ApiKey(file=str(key_file), owner="nobody")).changed


@pytest.mark.root
@ROOT_ONLY
def test_a_wrong_owner_is_fixed_without_touching_the_key(tmp_path: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    key_file = tmp_path / "k"
    key_file.write_text("kept\n")
    key_file.chmod(0o600)

    result = ensure_key(ApiKey(file=str(key_file), owner="nobody"))

    assert result.changed and "owner root:root -> nobody:" in result.message
    assert key_file.stat().st_uid == nobody.pw_uid
    assert key_file.read_text() == "kept\n"


def test_the_key_appears_in_no_message_and_no_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    key_file = tmp_path / "k"
    spec = ApiKey(file=str(key_file), owner=_me())
    messages = [ensure_key(spec).message]
    key_file.chmod(0o666)
    messages += [ensure_key(spec).message, ensure_key(spec).message]

    key = key_file.read_text().strip()
    assert len(key) == 43
    assert all(key not in m for m in messages)
    out, err = capsys.readouterr()
    assert key not in out + err + caplog.text
