"""Issue 24's hostile reader, sixth round, classes 4-6 (bounded network reads, output is data, state
never wedges): attacks on what the fifth round left or merged since (the hub listing's cache under
<state_dir>/cache/hub/, ...), found by reading docs/security.md and the code alone, each run for real
(real FIFOs and damaged files in a real state directory, a real process that must end), each seen
succeeding on main before its fix unless its docstring says it was already refused.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from probes.hub import cache_path
from tests.apply_support import Demo, demo_in
from tests.test_network_attacks import attacker, watched

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a listener of another user)")

REPO = "meta-llama/Llama-3.1-8B-Instruct"
COMMIT = "a" * 40

# The listing, asked in a process of its own: a read that waits on a FIFO is seen as a timeout there,
# not as a hung test run.
LISTING = r"""
import sys
from probes.hub import listing
found = listing(sys.argv[1], sys.argv[2], sys.argv[3], offline=sys.argv[4] == "1")
print("listing:", type(found).__name__, getattr(found, "reason", ""), flush=True)
"""


def _listing(cache: Path, revision: str, *, offline: bool) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": ""}
    args = [sys.executable, "-c", LISTING, REPO, revision, str(cache), "1" if offline else "0"]
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=30, env=env)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the listing waited on the cache for 30 s: {exc.stdout!r}") from None


def test_a_fifo_in_place_of_a_cached_hub_listing_never_hangs_the_plan(tmp_path: Path) -> None:
    """The plan asks the hub's listing (the weights' size before download) from its cache under
    <state_dir>/cache/hub/ first, offline too. main: a FIFO at `<owner>__<name>/<commit>.json` was
    opened with a plain `open()`, which waits for a writer: the plan (and apply, with the lock held)
    never ended."""
    cache = tmp_path / "state" / "cache" / "hub"
    path = Path(cache_path(str(cache), REPO, COMMIT))
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    run = _listing(cache, COMMIT, offline=True)
    assert run.returncode == 0, run.stderr
    assert "listing: Unavailable" in run.stdout, run.stdout
    left = sorted(p.name for p in path.parent.iterdir())
    assert f"{COMMIT}.json" not in left and any(n.startswith(f"{COMMIT}.json.corrupt-") for n in left), left


def test_a_fifo_in_place_of_a_failed_listing_note_never_hangs_the_plan(tmp_path: Path) -> None:
    """After a failed listing the plan notes why in `<commit>.json.failed` and, for 15 minutes, reads
    that note instead of asking the hub again. main: a FIFO there (fresh: its mtime is now) was opened
    with a plain `open()` and the plan waited for a writer for ever."""
    cache = tmp_path / "state" / "cache" / "hub"
    path = Path(cache_path(str(cache), REPO, COMMIT) + ".failed")
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    run = _listing(cache, COMMIT, offline=False)
    assert run.returncode == 0, run.stderr
    assert "listing: Unavailable" in run.stdout, run.stdout
    left = sorted(p.name for p in path.parent.iterdir())
    assert any(n.startswith(f"{path.name}.corrupt-") for n in left), left
    assert path.is_file() and not path.is_fifo()  # the hub was asked again; its failure noted afresh


def test_a_huge_failed_listing_note_is_not_read_into_memory(tmp_path: Path) -> None:
    """The same note as a 4 GiB sparse file. main: read whole into memory by every plan for 15
    minutes (`f.read()`, no bound): the child is given 1 GiB of address space and died of it."""
    cache = tmp_path / "state" / "cache" / "hub"
    path = Path(cache_path(str(cache), REPO, COMMIT) + ".failed")
    path.parent.mkdir(parents=True)
    with open(path, "wb") as f:
        f.truncate(4 << 30)
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": ""}
    code = f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({1 << 30}, {1 << 30}))\n" + LISTING
    run = subprocess.run(
        [sys.executable, "-c", code, REPO, COMMIT, str(cache), "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert run.returncode == 0 and "listing: Unavailable" in run.stdout, run.stdout + run.stderr
    assert "MemoryError" not in run.stderr and "\x00" not in run.stdout


@pytest.fixture
def demo(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    yield from demo_in(tmp_path)


# A tenth of the 1 MiB cap of each JSON answer, after a right-to-left override.
LONG = "\u202e" + "A" * 100_000
LINE_MAX = 2_000


@ROOT_ONLY
def test_a_listener_cannot_print_a_line_of_100000_characters_through_status_or_plan(
    demo: Demo, strangers: list[int]
) -> None:
    """No server runs; nobody listens on the deployment's port and answers `/version` with a version
    100,000 characters long (and `/v1/models` with such an id, a chat with such an answer): well under
    the 1 MiB body cap, so the bounded client returns it. main: `status` printed it whole, one line of
    100,000 characters; `status --json` and `plan` too (each seen on main)."""
    attacker(demo, strangers, "escapes", "*", LONG)
    for command in (("status",), ("status", "--json"), ("plan",), ("check",)):
        run = watched(demo, *command)
        assert run.returncode is not None, run
        assert "\u202e" not in run.output, command
        longest = max((len(line) for line in run.output.splitlines()), default=0)
        assert longest <= LINE_MAX, (command, longest, run.output[:3000])


def test_a_failed_starts_log_line_of_50000_characters_is_shown_cut(demo: Demo) -> None:
    """The server (a process of the deployment: its log is its own) fails its start with one log line
    of 50,000 characters (the fake takes it hex in one environment variable: at most 128 KiB). main:
    `apply` printed it whole in the failed start's log tail (escaped, but one line of 50,000)."""
    line = "ValueError: no attention backend " + LONG[:50_001]

    def edit(doc: Any) -> None:
        doc["server"]["env"]["FAKE_VLLM_FAIL_WITH_HEX"] = line.encode().hex()

    demo.write_spec(edit)
    run = watched(demo, "apply", wall=120)
    assert run.returncode == 4, run.output[-3000:]  # not converged: the server did not start
    assert "no attention backend \\u202eAAAA" in run.output, run.output[-3000:]
    longest = max(len(line) for line in run.output.splitlines())
    assert longest <= LINE_MAX, (longest, run.output[-3000:])


@pytest.mark.parametrize("name", ["profile", "generations"])
def test_a_fifo_in_place_of_a_generations_directory_never_stops_the_recording(demo: Demo, name: str) -> None:
    """<state_dir>/profile/ (the profile generations: what rollback restores) or generations/ (the
    per-apply journal) is a FIFO. main: every apply converged the machine but said `could not record
    the generation: .../profile is not a directory: move it aside` (or `could not write the generation
    record`), and so would every later one, unattended: no generation, no rollback, until a person
    came. Now it is moved aside with one line and the apply records its generation."""
    state = demo.root / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    os.mkfifo(state / name)
    run = demo.cli("apply")
    assert "could not" not in run.output and "internal error" not in run.output, run.output
    assert f"state: {state / name} was a FIFO, not a directory: moved aside" in run.output, run.output
    assert (state / name).is_dir() and any(p.name.startswith(f"{name}.corrupt-") for p in state.iterdir())
    history = demo.cli("history")
    assert history.returncode == 0 and "nothing applied yet" not in history.output, history.output
    assert (state / "profile" / "1.json").is_file() and (state / "generations" / "1.json").is_file()
