"""Issue 13, item 4: a secret in `[server] env` (HF_TOKEN) or read from `secret_files` reaches the
server's environment and nothing else: generations keep a hash, plan/diff/history/status show
(sensitive), a rotation restarts the server saying which variable changed, rollback uses today's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomlkit

from reconcile.safety.sensitive import (
    SENSITIVE,
    is_secret_name,
    netrc_text,
    placeholder,
    redact_generation,
    restore_document,
    split_credentials,
)
from tests.apply_support import Demo, demo_in, seed_venv

FIRST = "hf_FirstTokenValue0123456789abcdefXYZ"
SECOND = "hf_SecondTokenValue9876543210fedcbaQRS"


@pytest.fixture
def seeded(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    yield from demo_in(tmp_path, seed_venv(tmp_path_factory.getbasetemp(), {"ninja": "*"}))


def with_env(**values: str) -> Any:
    def edit(doc: Any) -> None:
        env = tomlkit.inline_table()
        env.update({**dict(doc["server"]["env"]), **values})
        doc["server"]["env"] = env

    return edit


def stored_bytes(demo: Demo) -> list[tuple[Path, bytes]]:
    """Every file reconcile keeps under the state dir, plus the log and the pidfile."""
    files = [p for p in demo.state_dir.rglob("*") if p.is_file()] + [demo.log, demo.pidfile]
    return [(p, p.read_bytes()) for p in files if p.exists()]


def assert_nowhere(demo: Demo, *secrets: str) -> None:
    for run in demo.runs:
        for s in secrets:
            assert s not in run.output, (run.argv, s)
    for path, data in stored_bytes(demo):
        for s in secrets:
            assert s.encode() not in data, (path, s)


def test_an_inline_hf_token_is_kept_as_a_hash_and_its_rotation_is_named(seeded: Demo) -> None:
    seeded.write_spec(with_env(HF_TOKEN=FIRST))
    assert seeded.cli("apply").returncode == 2
    assert seeded.server_environ("HF_TOKEN") == FIRST  # the server has it: nothing else does

    seeded.write_spec(with_env(HF_TOKEN=SECOND))
    plan = seeded.cli("plan")
    assert plan.returncode == 2 and "env changed: HF_TOKEN (sensitive) changed" in plan.output, plan.output
    assert "VLLM_API_KEY" not in plan.output  # old code: "VLLM_API_KEY, HF_TOKEN (secret) changed"
    assert seeded.cli("apply").returncode == 2
    assert seeded.server_environ("HF_TOKEN") == SECOND

    g1, g2 = seeded.generations()
    assert g1["spec_resolved"]["server"]["env"]["HF_TOKEN"] == placeholder(FIRST)
    assert json.dumps(placeholder(SECOND)) in g2["spec_text"]
    diff = seeded.cli("diff", "1", "2")
    assert diff.returncode == 0 and "(sensitive sha256:" in diff.stdout, diff.output
    for args in (("history",), ("status",), ("status", "--json"), ("plan", "--json")):
        assert seeded.cli(*args).returncode == 0
    back = seeded.cli("rollback", "1")
    assert back.returncode in (0, 2), back.output
    assert "server.env.HF_TOKEN (sensitive): the generation's value is kept only as a hash" in back.output
    assert seeded.server_environ("HF_TOKEN") == SECOND  # today's value: the old one was never kept
    assert_nowhere(seeded, FIRST, SECOND)


def test_a_secret_file_keeps_the_token_out_of_the_spec_and_a_rotation_restarts(seeded: Demo) -> None:
    token = seeded.root / "hf.token"
    token.write_text(FIRST + "\n")
    token.chmod(0o600)

    def edit(doc: Any) -> None:
        doc["server"]["secret_files"] = {"HF_TOKEN": str(token)}

    seeded.write_spec(edit)
    assert seeded.cli("apply").returncode == 2
    assert seeded.server_environ("HF_TOKEN") == FIRST
    token.write_text(SECOND + "\n")
    plan = seeded.cli("plan")
    assert "env changed: HF_TOKEN (sensitive) changed" in plan.output, plan.output
    assert seeded.cli("apply").returncode == 2
    assert seeded.server_environ("HF_TOKEN") == SECOND
    assert seeded.cli("apply").returncode == 0
    assert_nowhere(seeded, FIRST, SECOND)


def test_a_secret_file_others_can_read_is_a_warning_with_the_fix(tmp_path: Path) -> None:
    from reconcile.preflight.paths import path_findings
    from reconcile.spec.loader import load_spec

    token = tmp_path / "hf.token"
    token.write_text(FIRST)
    token.chmod(0o644)
    spec = tmp_path / "spec.toml"
    spec.write_text(
        f'[machine]\nstate_dir = "{tmp_path}/state"\n[server]\nname = "s"\nexecutable = "/bin/true"\n'
        f'model = "m"\nlog = "{tmp_path}/s.log"\nsecret_files = {{ HF_TOKEN = "{token}" }}\n'
    )
    found = path_findings(load_spec(str(spec)).spec)
    assert [(f.rule, f.severity, f.fix) for f in found] == [
        ("paths.secret-mode", "warning", f"chmod 600 {token}")
    ]
    token.chmod(0o600)
    assert path_findings(load_spec(str(spec)).spec) == ()


def test_a_missing_secret_file_is_one_line_naming_it(seeded: Demo) -> None:
    missing = seeded.root / "absent.token"

    def edit(doc: Any) -> None:
        doc["server"]["secret_files"] = {"HF_TOKEN": str(missing)}

    seeded.write_spec(edit)
    run = seeded.cli("apply")
    assert run.returncode == 4
    assert (
        f"[server].secret_files.HF_TOKEN: {missing}: cannot read it (No such file or directory)" in run.output
    )


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("HF_TOKEN", True),
        ("HUGGING_FACE_HUB_TOKEN", True),
        ("VLLM_API_KEY", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("db_password", True),
        ("GOOGLE_APPLICATION_CREDENTIALS", True),
        ("TOKENIZERS_PARALLELISM", False),
        ("MONKEY_PATCH", False),
        ("HF_HUB_OFFLINE", False),
        ("KEYRING_BACKEND", False),
    ],
)
def test_a_name_is_secret_when_a_word_of_it_says_so(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret
    assert is_secret_name(name, marked={name})


def test_index_credentials_are_split_off_the_url() -> None:
    assert split_credentials("https://bob:s3cr%40t@pypi.example:8443/simple") == (
        "https://pypi.example:8443/simple",
        ("pypi.example", "bob", "s3cr@t"),
    )
    assert split_credentials("https://pypi.example/simple") == ("https://pypi.example/simple", None)
    assert netrc_text([("h", "a", "b"), ("h", "a", "b")]) == "machine h login a password b\n"
    with pytest.raises(ValueError, match="different credentials"):
        netrc_text([("h", "a", "b"), ("h", "a", "c")])
    with pytest.raises(ValueError, match="netrc cannot carry them"):
        netrc_text([("h", "a", "b c")])


def test_a_generation_record_keeps_secrets_as_hashes_everywhere_in_it() -> None:
    doc = {
        "server": {"env": {"HF_TOKEN": FIRST, "OTHER": "x", "MINE": "m-secret-1"}, "secret_env": ["MINE"]},
        "venv": {"index_url": "https://u:idx-pass-1@h/simple", "extra_index_urls": ["https://h2/s"]},
    }
    text = f"[server]\nenv = {{ HF_TOKEN = \"{FIRST}\", MINE = 'm-secret-1' }}\n"
    record = {"spec_text": text, "spec_resolved": doc, "changes": [{"message": f"saw {FIRST}"}]}
    kept = json.dumps(redact_generation(record))
    for secret in (FIRST, "m-secret-1", "idx-pass-1"):
        assert secret not in kept
    assert "https://(sensitive)@h/simple" in kept and '"OTHER": "x"' in kept
    back, notes = restore_document(redact_generation(record)["spec_resolved"], doc)
    assert back == doc and notes == []
    with pytest.raises(ValueError, match=r"server.env.HF_TOKEN is sensitive"):
        restore_document(redact_generation(record)["spec_resolved"], {"server": {"env": {}}})
    assert SENSITIVE == "(sensitive)"
