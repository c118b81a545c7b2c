"""Issue 24's hostile reader, thirteenth round: attacks on what the twelfth round added (the listener
rule for network locations, the secrets-on-a-command-line rule, the nesting bound of JSON), found by
reading docs/security.md and the code alone, each run for real (nobody's listener on loopback and the
real pip, uv and huggingface_hub; the real CLI; real files in a real state directory), each seen
succeeding on main before its fix unless its docstring says it was already refused.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconcile.ownership.membership import uids
from reconcile.ownership.sockets import OTHERS_FDS_MAX
from tests.apply_support import Demo, demo_in, seed_venv
from tests.ownership_support import NOBODY, as_nobody, listening_as_nobody
from tests.test_hostile_reader12d import applied_with_arg, started_by_hand
from tests.test_network_env import applied_with_nobodys_index

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (another user's listener)")


# --- class 4: a network location written as the tools read it, not as urlsplit does ---------------


@ROOT_ONLY
@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("UV_INDEX_URL", "http://127.0.0.1:PORT\\simple"),
        ("PIP_INDEX_URL", "http://a,b@127.0.0.1:PORT/simple"),
    ],
    ids=["uv-backslash", "pip-comma-in-userinfo"],
)
def test_an_index_url_is_judged_by_the_host_the_installer_connects_to(
    demo: Demo, outside: Path, strangers: list[int], name: str, value: str
) -> None:
    """The listener rule read a URL with Python's urlsplit, and found its URLs with a pattern that ends
    one at `,;'"`. The installers read it otherwise: uv (WHATWG's URL standard) ends the authority at a
    backslash, so `http://127.0.0.1:P\\simple` is 127.0.0.1:P to uv, where urlsplit's port `P\\simple`
    raised ValueError and the URL was skipped; pip (urllib3) takes `a,b` as the userinfo of
    `http://a,b@127.0.0.1:P/simple`, where the pattern saw `http://a` and nothing after it. main (seen):
    root's venv got nobody's ninja 99.0 from nobody's index, its `.pth` ran as uid 0 six times (uv and
    pip alike, no line)."""
    applied_with_nobodys_index(demo, outside, strangers, name, value)


# (variable, value with PORT for nobody's port); each seen reaching a listener on loopback through the
# tool named (explore: a listener recording each connection, the real tool run with the variable set)
READINGS = [
    ("UV_INDEX_URL", "http://a]@127.0.0.1:PORT/simple"),  # uv; urlsplit raised "Invalid IPv6 URL": skipped
    ("UV_INDEX_URL", "http://127.0.0.1:PORT\\@example.invalid/simple"),  # uv; urlsplit: example.invalid
    ("UV_INDEX_URL", "http:127.0.0.1:PORT/simple"),  # uv: a special scheme needs no slashes
    ("UV_INDEX_URL", "http:/127.0.0.1:PORT/simple"),  # uv
    ("UV_INDEX_URL", "http://loc\talhost:PORT/simple"),  # uv drops a tab (and CR, LF) anywhere in a URL
    ("UV_INDEX_URL", "http://0x7f.0x.0x.0x1:PORT/simple"),  # uv: WHATWG's "0x" is 0; inet_aton refuses it
    ("HF_ENDPOINT", "http://a;b@127.0.0.1:PORT"),  # huggingface_hub (httpx2); pip and uv alike
    ("https_proxy", "nobody@127.0.0.1:PORT"),  # pip, uv, huggingface_hub
    ("https_proxy", "0:PORT"),  # pip, uv, huggingface_hub: host 0 is 0.0.0.0
    ("https_proxy", "2130706433:PORT"),  # pip, uv: 127.0.0.1 as one number
    ("https_proxy", "127.0.0.1:PORT/"),  # pip, huggingface_hub
    ("https_proxy", "//127.0.0.1:PORT"),  # pip
]


@ROOT_ONLY
@pytest.mark.parametrize(("name", "value"), READINGS)
def test_every_reading_a_tool_makes_of_a_location_is_held_to_the_listener_rule(
    demo: Demo, strangers: list[int], name: str, value: str
) -> None:
    """New members of the class, each a way a tool reads a host of this machine where the rule read
    another host or none: a `]` in the userinfo or junk after the port (urlsplit raised ValueError and
    the URL was skipped), a special scheme with no or one slash, a tab inside the host, WHATWG's IPv4
    numbers, userinfo holding `;`, and a proxy's bare host:port after `user@`, `//`, before `/`, or
    written as a number. nobody listens on each. main: all kept (no line)."""
    port = listening_as_nobody(strangers)
    value = value.replace("PORT", str(port))
    run = demo.cli("plan", env={name: value})
    assert f"reconcile: environment {name} left out: " in run.output, run.output
    assert f"port {port} on " in run.output and "listened on by nobody (uid 65534)" in run.output, run.output
    assert "Traceback" not in run.output, run.output


@ROOT_ONLY
def test_values_that_name_no_local_listener_are_kept(demo: Demo, strangers: list[int]) -> None:
    """What the wider reading must not refuse: a terminal's display, a time, colours, a remote index
    whose password holds `,;@`, a remote proxy, a remote URL whose query names a local port. Kept (no
    line), on main and now."""
    port = listening_as_nobody(strangers)
    env = {
        "DISPLAY": "localhost:10.0",
        "VLLM_SOMETHING_AT": "12:30",
        "LS_COLORS": "rs=0:di=01;34:ln=01;36:mh=00:pi=40;33:so=01;35:*.tar=01;31",
        "PIP_INDEX_URL": "https://user:p,w;d@pypi.example:8443/simple",
        "https_proxy": "http://proxy.example:3128",
        "HF_ENDPOINT": f"https://hub.example/?next=localhost:{port}",
    }
    run = demo.cli("plan", env=env)
    assert "environment" not in run.output or "left out" not in run.output, run.output
    assert "Traceback" not in run.output, run.output


# --- class 5 (secrets): a secret on the server's command line, spelled as vLLM reads it -----------

SECRET = "hf_13_never_on_a_command_line"
NUMBER = 918273645546372819  # a key of digits, written in TOML without quotes


@pytest.mark.parametrize(
    ("flag", "value", "seen"),
    [
        ("hf-tok", SECRET, SECRET),
        ("api-ke", SECRET, SECRET),
        ("hf-token", NUMBER, str(NUMBER)),
        ("kv-transfer-config", json.dumps({"kv_connector_extra_config": {"api_key": SECRET}}), SECRET),
        ("kv-transfer-config", {"kv_connector_extra_config": {"accessToken": SECRET}}, SECRET),
    ],
    ids=["prefix", "prefix-of-api-key", "number", "json-text", "camel-case"],
)
def test_a_secret_spelled_as_vllm_reads_it_never_reaches_a_command_line(
    demo: Demo, flag: str, value: Any, seen: str
) -> None:
    """Round 12 refused a flag whose last word is a secret word (`hf-token`, `api_key`) with a text
    value, and such a key inside a table. vLLM reads more spellings than that: its argparse takes any
    unique prefix of a long flag (`--hf-tok` is `--hf-token`, `--api-ke` is `--api-key`; the real vLLM
    reads `--api_ke` as well, its `_` a `-`), a flag's value is text whatever TOML made of it (a key of
    digits), a JSON flag's value is parsed whether the spec wrote a table or its JSON text, and a key
    in it may be camelCase (`accessToken`). main (seen): each planned as a warning at most, apply
    started the server with the secret on its command line, where nobody read it in /proc/PID/cmdline."""

    run, read = applied_with_arg(demo, flag, value)
    assert seen.encode() not in read, run.output
    assert run.returncode == 1 and "server.args" in run.output and "command line" in run.output, run.output
    assert "Traceback" not in run.output, run.output


def test_the_flags_that_take_a_secret_are_every_one_vllm_has() -> None:
    """The prefix rule needs vLLM's flags that take a secret by name (the spec's layer may not read the
    flag table): every flag of the table that is_secret_flag names, and no other."""
    from reconcile.safety.sensitive import VLLM_SECRET_FLAGS, is_secret_flag
    from reconcile.vllm.flags import table

    assert sorted(f[2:] for f in table().runs if is_secret_flag(f[2:])) == sorted(VLLM_SECRET_FLAGS)


@pytest.mark.parametrize("manage", [False, True])
def test_init_never_drafts_a_secret_spelled_as_vllm_reads_it(tmp_path: Path, manage: bool) -> None:
    """`reconcile init --pid` of a `vllm serve` root started by hand with `--hf-tok SECRET` and a JSON
    flag whose camelCase key holds one. main (seen): both drafted into the spec (0644, for a fleet
    repository), live or commented out; the JSON's key shown in full."""
    value = json.dumps({"kv_connector": "x", "kv_connector_extra_config": {"accessToken": SECRET}})
    args = ["--hf-tok", SECRET, "--kv-transfer-config", value]
    with started_by_hand(tmp_path, args, SECRET) as pid:
        argv = [sys.executable, "-m", "reconcile", "init", "--out", "-", "--pid", str(pid)]
        argv += ["--state-dir", str(tmp_path / "state"), *(["--manage-server"] if manage else [])]
        run = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert run.returncode == 0, run.stdout + run.stderr
    assert SECRET not in run.stdout + run.stderr, run.stdout
    assert "secret_files" in run.stdout, run.stdout


# --- class 6: JSON in a state file's string, parsed without the nesting bound ---------------------


@pytest.fixture
def seeded(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    yield from demo_in(tmp_path, seed_venv(tmp_path_factory.getbasetemp(), {"ninja": "*"}))


@pytest.mark.parametrize("key", ["argv.shown", "env.shown", "packages.shown"])
def test_a_launch_record_whose_shown_inputs_nest_past_the_bound_never_ends_a_plan(
    seeded: Demo, key: str
) -> None:
    """Round 12 put JSON from outside and from state through `untrusted.load_json` (its nesting bound),
    but the server record's `components` are strings (`MapOf(STR)`) whose JSON the plan's reason for a
    restart parses again (`identity._loads`: `json.loads`) for each input whose hash differs. main
    (seen): a record damaged to hold `[[[[...` 3,000 deep under `argv.shown` (`env.shown`,
    `packages.shown`) and another hash there, then a spec edit that restarts the server: every plan
    ended in `internal error: RecursionError`, and apply with it. Now parsed through load_json: the
    reason leaves that input's detail out, and the plan goes on."""
    first = seeded.cli("apply", "--auto-approve")
    assert first.returncode in (0, 2), first.output[-3000:]
    record_path = seeded.state_dir / f"server-{seeded.name}.json"
    record = json.loads(record_path.read_text())
    record["components"][key] = "[" * 3000 + "]" * 3000
    record["components"][key.split(".")[0]] = "0" * 16
    record_path.write_text(json.dumps(record))

    def edit(doc: Any) -> None:
        doc["server"]["args"]["max-num-seqs"] = 7

    run = seeded.cli("plan", spec=seeded.write_spec(edit))
    assert "internal error" not in run.output and "Traceback" not in run.output, run.output[-3000:]
    assert run.returncode == 2 and "restart" in run.output, run.output[-3000:]


def test_a_json_flag_nested_past_the_bound_is_never_an_internal_error(demo: Demo) -> None:
    """The same parse of a spec value: `[server] args` `hf-overrides` written as JSON text, which the
    preflight merges into config.json as vLLM would (`limits.apply_hf_overrides`: `json.loads`). A
    fleet repository's spec under review is read by `validate` too. main (seen): 3,000 levels of `[`
    ended every plan in `internal error: RecursionError`. Now parsed through load_json: text that is
    not JSON it takes leaves config.json as it is, as text that is not JSON did before."""

    def edit(doc: Any) -> None:
        doc["server"]["args"]["hf-overrides"] = "[" * 3000 + "]" * 3000

    run = demo.cli("plan", spec=demo.write_spec(edit))
    assert "internal error" not in run.output and "Traceback" not in run.output, run.output[-3000:]


# --- classes 4, 6 (ownership): the holder lookup's bound, read past through a setuid program ------

# nobody's listener on 127.0.0.1 at `port` (the server's address: it is down), and `forks` processes that
# hold `fds` inheritable descriptors and exec su (setuid root: euid 0, the real uid nobody's), left waiting
# at its password prompt on a pipe nobody keeps open. `handed` 0: the listener is held by nobody's newest
# process; 1: by su alone.
SU_TREE = r"""
import os, resource, signal, socket, sys, time
forks, fds, port, handed = (int(a) for a in sys.argv[1:5])
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
prompt, keep = os.pipe()
null = os.open("/dev/null", os.O_RDONLY)
held = [os.dup(null) for _ in range(min(fds, hard - 16))]
for fd in held:
    os.set_inheritable(fd, True)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen()
s.set_inheritable(bool(handed))
for _ in range(forks):
    if os.fork() == 0:
        os.dup2(prompt, 0)
        os.execv("/usr/bin/su", ["su", "root"])
if not handed and os.fork() == 0:
    signal.pause()
s.close()
for fd in held:
    os.close(fd)
time.sleep(0.5)
print("ready", flush=True)
signal.pause()
"""
NEEDS_SU = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/usr/bin/su"), reason="needs root and su (setuid root)"
)


@NEEDS_SU
def test_a_setuid_program_of_another_user_does_not_lift_the_holder_lookups_bound(
    demo: Demo, strangers: list[int]
) -> None:
    """Round 12 bounded the descriptors the holder lookup reads of other users' processes, and read
    root's whole; a process was root's when its effective uid was 0. nobody holds 19,000 inheritable
    descriptors (its hard limit here) and execs `su`, setuid root, left waiting at its password prompt:
    euid 0, real uid nobody's, every descriptor kept across the exec. main (seen): seven such processes
    were read whole, and the listener nobody started after them was looked up past the bound (`held by
    pid N (user nobody: ...)`); a few hundred of them make each look as slow as round 12 measured before
    its bound. Now a process is root's or ours only when its real and effective uids both are."""
    per = min(19_000, resource.getrlimit(resource.RLIMIT_NOFILE)[1] - 16)  # nobody's hard limit is ours
    forks = OTHERS_FDS_MAX // per + 2
    children, row, output = _holder_row(demo, strangers, str(forks), str(per), str(demo.port), "0")
    assert len(children) == forks + 1 and all(uids(c) == (NOBODY, 0) for c in children[:forks]), children
    assert "user nobody" in row and "not looked up" in row, output


def _holder_row(demo: Demo, strangers: list[int], *args: str) -> tuple[list[int], str, str]:
    """SU_TREE run as nobody with `args` (its children strangers too), then `plan`: the children, the
    plan's row naming who holds the spec's port, and the plan's output."""
    top = as_nobody(["/usr/bin/python3", "-c", SU_TREE, *args], {}, strangers)
    children = [int(c) for c in Path(f"/proc/{top.pid}/task/{top.pid}/children").read_text().split()]
    strangers.extend(children)
    plan = demo.cli("plan")
    assert "internal error" not in plan.output, plan.output
    [row] = [line for line in plan.output.splitlines() if f"port {demo.port}" in line and "held by" in line]
    return children, row, plan.output


@NEEDS_SU
def test_another_users_listener_held_by_a_setuid_program_is_named_as_theirs(
    demo: Demo, strangers: list[int]
) -> None:
    """The holder of a listener was named by its effective uid. nobody listens on the spec's port and
    hands the socket to `su` (setuid root, waiting at its prompt), keeping none itself. main (seen): the
    plan said the port is held by `su root` of user root, an operator's own-looking process (the key
    was not sent: membership asks for both uids). Now the holder is named by its real uid: nobody."""
    _children, row, output = _holder_row(demo, strangers, "1", "0", str(demo.port), "1")
    assert "of user nobody" in row and "user root" not in row, output


# --- class 6: a spec document nested past the bound ------------------------------------------------


def _nested_spec(doc: Any, depth: int) -> None:
    inner: Any = 1
    for _ in range(depth):
        inner = {"a": inner}
    doc.setdefault("model", {})["config"] = {"x": inner}


@pytest.mark.parametrize("command", ["plan", "validate"])
def test_a_spec_nested_past_the_bound_is_a_spec_error_never_an_internal_error(
    demo: Demo, command: str
) -> None:
    """Round 12 bounded the nesting of JSON from outside and of state (64 levels), and left the spec's
    own documents to their parser. A `[model] config` patch (or any table, or a dotted key) nested 900
    deep is TOML tomllib reads; the loader's reference walk then recurses two frames a level. main
    (seen): `reconcile plan` and `reconcile validate DIR` (a fleet repository's CI check, run on
    specs under review) ended in `internal error: RecursionError`. Now a spec document nested past 64
    levels is a spec error naming the file, the line and the key."""
    path = demo.write_spec(lambda doc: _nested_spec(doc, 900))
    if command == "plan":
        run = demo.cli("plan", spec=path)
        output = run.output
    else:
        argv = [sys.executable, "-m", "reconcile", "validate", str(path.parent)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=180, env=demo.env())
        output, run = done.stdout + done.stderr, done  # type: ignore[assignment]
    assert "internal error" not in output and "Traceback" not in output, output[-3000:]
    assert run.returncode == 1 and f"{path.name}:" in output, output[-3000:]
    assert "model.config.x.a" in output and "nested deeper than 64 levels" in output, output[-3000:]
