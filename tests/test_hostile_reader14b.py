"""Issue 24's hostile reader, fourteenth round: attacks on what the thirteenth round added (every reading
a tool makes of a network location, the secrets-on-a-command-line rule, the nesting bounds, the holder
lookup by real uid), found by reading docs/security.md and the code alone, each run for real (the real
CLI, a real environment, real processes), each seen succeeding on main before its fix unless its
docstring says it was already refused.
"""

from __future__ import annotations

import resource
import subprocess
from typing import Any

import pytest

from tests.apply_support import Demo
from tests.test_hostile_reader import nobody_runs
from tests.test_hostile_reader12d import applied_with_arg
from tests.test_untrusted_trees import Tree, tree

__all__ = ["tree"]  # the fixture, from the source-tree attacks

# --- class 4 and 6: a location's reading bounded in time and memory --------------------------------

# Each `http:` starts a URL (a special scheme needs no slashes) whose authority runs on to the value's
# end, and each `@` ends a piece of it: main judged every later piece again for every earlier URL.
MANY_URLS = "http:@" * 12_000  # 72,000 characters: an environment string may be 131,072
LONG_PORT = "http://127.0.0.1:" + "9" * 5_000 + "/simple"  # past int()'s 4,300 digits
MEMORY = 1 << 30


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


@pytest.mark.parametrize("where", ["environment", "spec"])
@pytest.mark.parametrize("value", [MANY_URLS, LONG_PORT], ids=["many-urls", "long-port"])
def test_a_locations_reading_is_bounded_and_never_ends_a_run(demo: Demo, where: str, value: str) -> None:
    """The thirteenth round reads a location as every tool does: after each scheme, the authority runs
    to `/?#` or a space, and each piece of it between `@\\,;'"` is judged. A value of many URLs with no
    `/` between them (`http:@http:@...`) made each URL's authority the rest of the value: its pieces
    were gathered again for every URL before them, quadratic in the value's length, in time and memory,
    at every start (an environment variable) and in every plan (a `[server] env` value). main (seen):
    this 72,000-character value ran `plan` out of 1 GiB (MemoryError, an internal error) after a
    few seconds; a 24,000-character one took 43 s and 900 MiB in `listener_problem` alone. Beside it, a
    URL's port of 5,000 digits: the rule called int() on it, which Python refuses past 4,300 digits.
    main (seen): `internal error: ValueError` (and MemoryError), from the environment and from the spec.
    Now each piece is read by a pattern where it starts, never copied to the value's end, and a port
    longer than 5 digits names no location (no tool reaches one past 65535)."""
    env = {}
    if where == "environment":
        env["VLLM_MIRRORS"] = value
    else:

        def edit(doc: Any) -> None:
            doc["server"].setdefault("env", {})["VLLM_MIRRORS"] = value

        demo.write_spec(edit)
    run = subprocess.run(
        demo.command("plan"),
        capture_output=True,
        text=True,
        timeout=600,
        env={**demo.env(), **env},
        cwd=str(demo.root),
        preexec_fn=_limited,
    )
    output = run.stdout + run.stderr
    assert run.returncode in (0, 2), output
    assert "internal error" not in output and "MemoryError" not in output and "Traceback" not in output, (
        output
    )


# --- class 5 (secrets): a flag smuggled in a flag's value ----------------------------------------

SECRET = "hf_14b_never_on_a_command_line"


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("lora-modules", ["a=/nonexistent", "--hf-token", SECRET]),
        ("allowed-origins", ["*", f"--api-key={SECRET}"]),
    ],
    ids=["list-element-flag", "list-element-flag-equals"],
)
def test_a_flag_smuggled_in_a_flags_value_never_reaches_a_command_line(
    demo: Demo, flag: str, value: Any
) -> None:
    """The secret rule judges each `[server] args` key as the flag it is, and its value as that flag's.
    But a value is rendered as its own argv token, and a list's elements each as one after the flag
    (nargs="+"): an element `--hf-token` is, to vLLM's argparse, a flag of its own, which ends the list
    and takes the next element as its value (`--api-key=S` the same, in one token). So a secret, or any
    flag the spec's rules key on the name of (`trust-remote-code`, which holds the model's source to the
    read role), rides in under another flag's name. main (seen): planned, apply started the server with
    `--hf-token SECRET` on its command line, read there by nobody in /proc/PID/cmdline."""
    run, read = applied_with_arg(demo, flag, value)
    assert SECRET.encode() not in read, run.output
    assert run.returncode == 1 and f"server.args.{flag}" in run.output, run.output
    assert "Traceback" not in run.output, run.output


# --- class 5 (secrets): a password in a URL of the server's environment ---------------------------

PROXY_PASSWORD = "pw14b-never-kept-or-shown"


def test_a_url_password_in_the_servers_environment_is_never_kept_or_shown(demo: Demo) -> None:
    """A URL's user:password is a secret in `[venv]` index URLs and anywhere in `[server] args` (rounds
    12-13). In `[server] env` a value was secret only by its name: `https_proxy = "http://user:PW@proxy:
    3128"` or `HF_ENDPOINT = "https://user:PW@mirror"`, the credentials vLLM's hub client sends, were
    neither. main (seen): plan, apply, status and history did not show it, but it was kept in the state
    directory, in generations/1.json and profile/1.json (the resolved spec and the spec text)."""

    def edit(doc: Any) -> None:
        doc["server"].setdefault("env", {})["https_proxy"] = (
            f"http://proxyuser:{PROXY_PASSWORD}@proxy.invalid:3128"
        )

    demo.write_spec(edit)
    runs = [demo.cli("plan"), demo.cli("apply", timeout=300), demo.cli("status"), demo.cli("history")]
    assert "Apply converged" in runs[1].output, runs[1].output
    for run in runs:
        assert PROXY_PASSWORD not in run.output, run.output
    kept = [p for p in demo.state_dir.rglob("*") if p.is_file() and PROXY_PASSWORD.encode() in p.read_bytes()]
    assert kept == [], kept


# --- class 2: the trust-remote-code rule reads the flag as vLLM does ----------------------------


@pytest.mark.parametrize(
    "args",
    [
        "{ trust-remote = true }",
        "{ trust_remote-code = true }",
        "{ config = 'CONFIG' }",
    ],
    ids=["prefix", "mixed-separators", "config-file"],
)
def test_remote_code_spelled_as_vllm_reads_it_holds_the_source_to_the_read_role(
    tree: Tree, args: str
) -> None:
    """Round 13 taught the secret rule that vLLM's argparse takes a unique prefix of a long flag and reads
    `_` as `-`. The trust-remote-code rule (nobody's `[model] source` becomes code root's server imports)
    still looked the flag up by its two exact spellings: `trust-remote = true` (vLLM: --trust-remote-code,
    the only flag it prefixes), `trust_remote-code` (one `_`, one `-`), and `config = FILE`, whose YAML
    vLLM reads as flags (`trust-remote-code: true` in a root-owned file), each passed. main (seen): the
    plan went ahead without a word, nobody's modeling_x.py in the source."""
    nobody_runs(f"printf 'import os\\nos.system(\"id > /tmp/x\")\\n' > {tree.source}/modeling_x.py")
    config = tree.root / "vllm.yaml"
    config.write_text("trust-remote-code: true\n")
    tree.spec.write_text(
        tree.spec.read_text()
        + f'\n[server]\nname = "m"\nexecutable = "/bin/true"\nlog = "{tree.root / "m.log"}"\n'
        + f"args = {args.replace('CONFIG', str(config))}\n"
    )
    plan = tree.cli("plan")
    assert "Traceback" not in plan.output, plan.output
    assert "trust-remote-code" in plan.output and str(tree.source) in plan.output, plan.output
    assert plan.returncode == 1 or "✗" in plan.output, plan.output
