"""Issue 24's hostile reader, twelfth round: process ownership and signals, and the commands besides
plan/apply (init, timer cron, the API key's and other secrets' ways onto a command line), found by
reading docs/security.md ("# Processes, ownership and the API key" first) and the code alone, each run
for real (`nobody` through setuid, real processes, real /proc, real listeners, the real CLI), each
seen succeeding on main before its fix unless its docstring says it was already refused.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconcile.ownership.sockets import OTHERS_FDS_MAX, listeners
from tests.apply_support import DEMO_MODEL, Demo, Run, cmdlines
from tests.ownership_support import NOBODY, as_nobody, root_only
from tests.test_init import make_vllm_venv
from tests.test_server_support import free_port, wait_for

pytestmark = root_only

# nobody's process tree: `forks` children that only wait, each holding `fds` descriptors (the hard
# limit allows), and, given a port, a last child listening on 127.0.0.1 at it (the newest pid: a scan
# in pid order reaches it last). Forked children share their parent's pages: an environment of 1.4 MB
# costs nobody 1.4 MB however many children carry it.
TREE = r"""
import os, resource, signal, socket, sys, time
forks, fds, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
if fds:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    null = os.open("/dev/null", os.O_RDONLY)
    for _ in range(min(fds, hard - 16)):
        os.dup(null)
for _ in range(forks):
    if os.fork() == 0:
        signal.pause()
        os._exit(0)
os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
if port and os.fork() == 0:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))  # the server's address (127.0.0.2 is another's: round 17c, closed)
    s.listen()
    signal.pause()
time.sleep(0.2)
print("ready", flush=True)
signal.pause()
"""


def nobodys_tree(strangers: list[int], forks: int, fds: int = 0, port: int = 0, **env: str) -> None:
    """TREE run as nobody; every process of it is a stranger the teardown kills."""
    top = as_nobody(["/usr/bin/python3", "-c", TREE, str(forks), str(fds), str(port)], env, strangers)
    children = Path(f"/proc/{top.pid}/task/{top.pid}/children").read_text().split()
    strangers.extend(int(c) for c in children)
    assert len(children) == forks + (1 if port else 0), children


def peak_memory_mib(argv: list[str], demo: Demo) -> tuple[float, str]:
    """Run `argv` as the CLI runs; its peak resident memory (MiB, the kernel's own count) and output."""
    out = demo.root / "cli.out"
    with open(out, "wb") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=demo.env(), cwd=str(demo.root))
    _pid, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_maxrss / 1024, out.read_text(errors="replace")


# --- what another user's processes hold is read within a bound (classes 4, 6) ---------------------


def test_another_users_environments_are_never_read_into_roots_plan(demo: Demo, strangers: list[int]) -> None:
    """Membership read /proc/PID/environ of every process on the machine, and only then looked at its
    uid: nobody's 150 forked children, each with a 1.4 MB environment (shared pages: 1.4 MB of nobody's
    memory), made every scan read 210 MB and hold it at once (main: `reconcile plan` peaked 220 MiB higher,
    `deployment_members` took 3.7 s for 200 such children of 5.7 MB; with a few thousand, root's plan,
    apply and stop run out of memory). Now a process of another uid is judged by its uid first and its
    environment never read."""
    before, _ = peak_memory_mib(demo.command("plan"), demo)  # what root's own processes cost it
    nobodys_tree(strangers, 150, **{f"FILLER{i}": "x" * 120_000 for i in range(12)})
    peak, output = peak_memory_mib(demo.command("plan"), demo)
    assert "internal error" not in output, output
    assert peak - before < 100, (before, peak, output[-2000:])


def test_the_holder_of_another_users_listener_is_looked_up_within_a_bound(
    demo: Demo, strangers: list[int]
) -> None:
    """Who holds a socket on the port was found by reading every descriptor of every process until the
    holder turned up: nobody listens on the spec's port (127.0.0.1, while the server is down) from its
    newest process, after processes holding 19,000 descriptors each (its hard limit here; a few MB of
    nobody's memory). Main read them all before naming it, on each of the
    plan's looks: 50 such processes took 4.7 s a look, and systemd's default hard limit (524,288) makes
    it minutes a look, every plan, status, check and apply. Now other users' descriptors are read up to
    a bound, past which the listener is named by its socket's user; root's processes (here a root
    listener started after nobody's, as our own HAProxy or server would be) are still read whole."""
    per = min(19_000, resource.getrlimit(resource.RLIMIT_NOFILE)[1] - 16)  # nobody's hard limit is ours
    nobodys_tree(strangers, OTHERS_FDS_MAX // per + 2, fds=per, port=demo.port)
    plan = demo.cli("plan")
    assert "internal error" not in plan.output, plan.output
    [row] = [line for line in plan.output.splitlines() if f"port {demo.port}" in line and "held by" in line]
    assert "user nobody" in row and "not looked up" in row, plan.output
    listen = f"import socket, time; s = socket.create_server(('127.0.0.3', {demo.port})); print('ready')"
    listen += "; import sys; sys.stdout.flush(); time.sleep(60)"
    with subprocess.Popen([sys.executable, "-c", listen], stdout=subprocess.PIPE) as roots:
        try:
            assert roots.stdout is not None and roots.stdout.readline().strip() == b"ready"
            held = {x.uid: x for x in listeners(demo.port)}
            assert held[0].pid == roots.pid and held[NOBODY].pid is None, held
        finally:
            roots.kill()


# --- a secret never on a command line (the API key's rule, for every secret) ----------------------

SECRET = "hf_12d_never_on_a_command_line"


@pytest.mark.parametrize(
    "flag, value",
    [
        ("hf-token", SECRET),
        ("otlp-traces-endpoint", f"http://tracer:{SECRET}@127.0.0.1:4317"),
        ("kv-transfer-config", {"kv_connector": "x", "kv_connector_extra_config": {"api_key": SECRET}}),
    ],
)
def test_a_secret_in_server_args_never_reaches_a_command_line_every_user_reads(
    demo: Demo, flag: str, value: Any
) -> None:
    """The spec refused `args.api-key` (the key on the command line, /proc/PID/cmdline: readable by
    every local user), but not vLLM's `--hf-token`, a URL with credentials, or a key inside a JSON
    flag: main started the server with the token on its command line (read there as nobody), showed
    it in `status`, kept it in the launch record. Now a flag named for a secret (its last word: token,
    key, secret, password, credential), a key so named inside a value, and a URL's user:password are
    refused at load, `FILE:LINE: server.args...` and the fix (the environment, through secret_files)."""

    run, seen = applied_with_arg(demo, flag, value)
    assert SECRET.encode() not in seen, run.output
    assert run.returncode == 1 and "server.args" in run.output and "command line" in run.output, run.output


def applied_with_arg(demo: Demo, flag: str, value: Any) -> tuple[Run, bytes]:
    """`apply` of the demo spec with `[server] args` `flag` = `value`; its run, and every command line
    on the machine as nobody reads them then (/proc/PID/cmdline)."""

    def edit(doc: Any) -> None:
        doc["server"]["args"][flag] = value

    demo.write_spec(edit)
    run = demo.cli("apply", timeout=300)
    seen = subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "cat", *_proc_cmdlines()],
        capture_output=True,
    ).stdout
    return run, seen


def _proc_cmdlines() -> list[str]:
    return [f"/proc/{e}/cmdline" for e in os.listdir("/proc") if e.isdigit()]


@pytest.fixture
def hand_started(tmp_path: Path) -> Iterator[int]:
    """A `vllm serve` root started by hand (the fake, from a venv), with vLLM's --hf-token and a tracing
    endpoint with credentials on its command line, as `reconcile init` finds servers."""
    args = ["--hf-token", SECRET, "--otlp-traces-endpoint", f"http://tracer:{SECRET}@127.0.0.1:4317"]
    with started_by_hand(tmp_path, args, SECRET) as pid:
        yield pid


@contextlib.contextmanager
def started_by_hand(tmp_path: Path, args: list[str], secret: str) -> Iterator[int]:
    """The fake `vllm serve` of a venv, started by root with `args`, once `secret` shows in /proc."""
    venv = make_vllm_venv(tmp_path)
    argv = [str(venv / "bin" / "vllm"), "serve", str(DEMO_MODEL), "--port", str(free_port()), *args]
    env = {
        "PATH": os.environ["PATH"],
        "FAKE_VLLM_HOLD": str(tmp_path / "gpus"),
        "FAKE_VLLM_MAX_LIFETIME": "60",
    }
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        wait_for(lambda: secret in "".join(cmdlines()), 20, "the server in /proc")
        yield proc.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@pytest.mark.parametrize("manage", [False, True])
def test_init_never_drafts_a_secret_it_found_on_a_command_line(
    tmp_path: Path, hand_started: int, manage: bool
) -> None:
    """`reconcile init` left out `--api-key` only: main drafted `hf-token = "<token>"` and the URL with
    its password into the spec (0644, for a fleet repository), live or commented out. Now every value
    the secret rule refuses is left out, and the draft says where the secret goes instead."""
    argv = [sys.executable, "-m", "reconcile", "init", "--out", "-", "--pid", str(hand_started)]
    argv += ["--state-dir", str(tmp_path / "state"), *(["--manage-server"] if manage else [])]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert run.returncode == 0, run.stdout + run.stderr
    assert SECRET not in run.stdout + run.stderr, run.stdout
    assert "--hf-token" in run.stdout and "secret_files" in run.stdout, run.stdout


# --- a generated schedule acts on no path before reconcile's checks ------------------------------


@pytest.fixture
def unclaimed() -> Iterator[Path]:
    """A name nobody has made yet directly under the sticky, world-writable /var/tmp."""
    path = Path("/var/tmp") / f"reconcile-unclaimed-12d-{os.getpid()}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_cron_line_never_opens_a_state_path_another_user_chose(tmp_path: Path, unclaimed: Path) -> None:
    """The cron line's shell makes the state dir (`mkdir -p`), opens `timer.lock` (`flock`) and appends
    to `timer.log` by name, as root, before `reconcile apply` walks the state dir: with a state_dir
    under a directory nobody made (here a name under /var/tmp nobody took first, its `state` a link to a
    directory only root may enter), each tick created root's 0644 `timer.lock` and `timer.log` where
    nobody chose (a FIFO there would hold every tick's flock forever); apply itself refused the path.
    Now `timer cron` walks and makes the state dir first, as apply would, and refuses to write the line
    for one it cannot trust."""
    private = tmp_path / "root-only"
    private.mkdir(mode=0o700)
    spec = tmp_path / "box.toml"
    spec.write_text(f'[machine]\nstate_dir = "{unclaimed}/state"\n\n[apt]\npackages = ["bash"]\n')
    subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "sh", "-c",
         f"mkdir {unclaimed} && ln -s {private} {unclaimed}/state"],
        check=True,
    )  # fmt: skip
    argv = [sys.executable, "-m", "reconcile", "timer", "cron", "--every", "5m", "--randomized-delay", "0"]
    made = subprocess.run([*argv, "--spec", str(spec)], capture_output=True, text=True, timeout=60)
    line = next((ln for ln in made.stdout.splitlines() if ln.startswith("*/5 ")), None)
    if line is not None:  # as cron runs it: root's /bin/sh, cron's PATH, in /
        command = line.split(" root ", 1)[1].replace("\\%", "%")
        subprocess.run(
            ["sh", "-c", command], cwd="/", env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, timeout=120
        )
    assert sorted(os.listdir(private)) == [], made.stdout + made.stderr
    assert made.returncode == 1 and f"{unclaimed} is owned by nobody" in made.stderr, (
        made.stdout + made.stderr
    )
