"""Issue 24's hostile reader, seventh round, classes 4-6 (bounded network reads, output is data, state
never wedges): attacks on what the sixth round added or left open (the hub listing's cache directory
`<owner>__<name>`, noted open there), found by reading docs/security.md and the code alone, each run
for real (real FIFOs, files and symlinks in a real state directory, a real process that must end), each
seen succeeding on main before its fix unless its docstring says it was already refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from probes.hub import cache_path
from tests.apply_support import Demo, demo_in
from tests.ownership_support import as_nobody
from tests.test_network_attacks import HOSTILE, watched

REPO = "meta-llama/Llama-3.1-8B-Instruct"
COMMIT = "a" * 40
# A tenth of the 1 MiB cap of each JSON answer, after a right-to-left override (as in round 6).
LONG = "\u202e" + "A" * 100_000

# The listing, asked twice in a process of its own (a read that waits on a FIFO is a timeout there,
# not a hung test run); nothing listens at HF_ENDPOINT, so the first asking fails and notes why.
LISTING = r"""
import sys
from probes.hub import listing
for _ in range(2):
    found = listing(sys.argv[1], sys.argv[2], sys.argv[3], offline=False)
    print("listing:", type(found).__name__, getattr(found, "reason", ""), flush=True)
"""


@pytest.mark.parametrize("kind", ["fifo", "file", "symlink"])
def test_a_non_directory_in_place_of_a_repos_cache_directory_is_moved_aside(
    tmp_path: Path, kind: str
) -> None:
    """The hub listing's cache keeps each repo under <state_dir>/cache/hub/<owner>__<name>/ (the sixth
    round noted it open). main: a FIFO or a file there made every cache write fail silently (best
    effort) and every read miss: each plan asked the hub again, and offline never had a listing, for
    good; a symlink there (to a directory elsewhere) was followed: root wrote its failure note in the
    directory the link names and read it back from there. Now it is moved aside like any damaged state
    (the link renamed, never followed) and the repo's directory is made afresh."""
    cache = tmp_path / "state" / "cache" / "hub"
    path = Path(cache_path(str(cache), REPO, COMMIT))
    owner_dir = path.parent
    cache.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if kind == "fifo":
        os.mkfifo(owner_dir)
    elif kind == "file":
        owner_dir.write_text("not a directory\n")
    else:
        owner_dir.symlink_to(elsewhere)
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": ""}
    try:
        run = subprocess.run(
            [sys.executable, "-c", LISTING, REPO, COMMIT, str(cache)],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the listing waited for 60 s: {exc.stdout!r}") from None
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith("listing: Unavailable") for line in lines), run.stdout
    # The second asking read the first one's note: the cache works again.
    assert "asked less than 15 minutes ago" in lines[1], run.stdout
    assert owner_dir.is_dir() and not owner_dir.is_symlink(), kind
    assert (owner_dir / f"{COMMIT}.json.failed").is_file()
    assert any(p.name.startswith(f"{owner_dir.name}.corrupt-") for p in cache.iterdir()), list(
        cache.iterdir()
    )
    assert list(elsewhere.iterdir()) == [], "root wrote through the symlink"


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    yield from demo_in(tmp_path)


ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a listener of another user)")
LINE_MAX = 2_000


@ROOT_ONLY
def test_a_listeners_100000_character_process_title_is_not_one_line_of_output(
    demo: Demo, strangers: list[int]
) -> None:
    """`nobody` listens on the deployment's port from a process whose command line holds one argument
    of 100,000 characters (after a right-to-left override): the plan observes that listener, its
    command line included. The sixth round cut server answers to 1,000 characters "and no longer in
    `--json` either"; main: `plan --json` and `status --json` printed the listener's command line whole,
    one line of 100,000 characters (seen on main)."""
    argv = ["/usr/bin/python3", "-c", HOSTILE, str(demo.port), "escapes", "*", json.dumps("fine"), LONG]
    as_nobody(argv, {}, strangers)
    for command in (("plan", "--json"), ("status", "--json"), ("plan",), ("status",)):
        run = watched(demo, *command)
        assert run.returncode is not None, run
        assert "\u202e" not in run.output, command
        longest = max((len(line) for line in run.output.splitlines()), default=0)
        assert longest <= LINE_MAX, (command, longest, run.output[:3000])


@pytest.mark.parametrize("since", [1e300, -1e300])
def test_a_pause_file_with_a_timestamp_out_of_range_never_wedges_the_machine(
    demo: Demo, since: float
) -> None:
    """The pause file (`reconcile pause`) whose `since` and `until` are finite numbers past any date
    (1e300, -1e300): the shape allowed any finite number. main: every `plan`, `status`, `apply` and
    even `resume` ended in `internal error: OverflowError: timestamp out of range for platform
    time_t`, for good, until a person removed the file by hand (seen on main). Now a timestamp out of
    any date is a shape error: the file is moved aside, a pause saying so holds (the safe side, as for
    any damaged pause file), and `resume` lifts it."""
    from reconcile.unattended.pause import PAUSE_FILE, pause_path

    demo.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = Path(pause_path(str(demo.state_dir)))
    path.write_text(json.dumps({"reason": "x", "user": "root", "pid": 1, "since": since, "until": 1e300}))
    status = demo.cli("status")
    assert "internal error" not in status.output, status.output
    assert f"{PAUSE_FILE} was damaged" in status.output, status.output
    assert any(p.name.startswith(f"{PAUSE_FILE}.corrupt-") for p in demo.state_dir.iterdir())
    resume = demo.cli("resume")
    assert resume.returncode == 0 and "internal error" not in resume.output, resume.output
    plan = demo.cli("plan")
    assert "internal error" not in plan.output and "was damaged" not in plan.output, plan.output
