"""Issue 24's hostile reader, twelfth round, classes 4-6 (bounded network reads, output is data, state
never wedges): attacks on what rounds 10 and 11 added and left open, found by reading docs/security.md
and the code alone, each run for real (a model source tree of nobody's and the real `reconcile plan`, a
hub listening on loopback and the plan's own listing, real files in a real state directory), each seen
succeeding on main before its fix unless its docstring says it was already refused.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.apply_support import DEMO_MODEL, Demo, demo_in, seed_venv, stop_servers
from tests.ownership_support import NOBODY, NOGROUP, nobodys_dir
from tests.test_hostile_reader9b import LISTING, ROOT_ONLY, _Hub, apply_killed_while_loading, with_hub
from tests.test_hostile_reader11 import _plan

COMMIT = "a" * 40


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    yield from demo_in(tmp_path)


# --- class 6: a model's config.json nested past what any model has ---------------------------------


def _nested(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


def _nobodys_source(demo: Demo, config: str) -> Path:
    """A copy of the demo model in a tree of nobody's (a publisher's, or another user's `[model] source`)
    whose config.json is `config`; the demo spec points at it."""
    source = nobodys_dir(demo.root, "src")
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        shutil.copyfile(DEMO_MODEL / name, source / name)
    (source / "config.json").write_text(config)
    for path in source.iterdir():
        os.chown(path, NOBODY, NOGROUP)
    demo.spec_path.write_text(demo.spec_path.read_text().replace(str(DEMO_MODEL), str(source)))
    return source


@ROOT_ONLY
@pytest.mark.parametrize("where", ["config.json", "tokenizer_config.json"])
def test_a_model_document_nested_past_what_any_model_has_is_refused_never_an_internal_error(
    demo: Demo, where: str
) -> None:
    """`untrusted.load_json` turned json's RecursionError into ValueError, so a document nested past
    the parser's own limit (~1,000) is refused; one nested less deep (600) parses, and the code after
    it recurses over it one to three frames a level. main (seen): nobody's source tree with a
    config.json (or tokenizer_config.json) holding `"x": {"a": {"a": ... 600 deep}}` ended every
    `reconcile plan` in `internal error: RecursionError` (the preflight memo's `_spell`; DeepDiff, as
    the model.config row calls it, failed between 300 and 500 levels when tried alone). Now a JSON
    document from outside or from the state dir nested deeper than `untrusted.JSON_DEPTH_MAX` (64; the
    47 model configs in tests/data nest 5 at most) is not JSON reconcile takes: the plan goes on
    without it, and once the files are in the model dir its model.config row names the file and why."""
    config = json.loads((DEMO_MODEL / "config.json").read_text())
    if where == "config.json":
        raw = json.dumps(config)[:-1] + ', "x": ' + _nested(600) + "}"
    else:
        raw = json.dumps(config)
    source = _nobodys_source(demo, raw)
    if where != "config.json":
        tokenizer = json.loads((DEMO_MODEL / where).read_text())
        (source / where).write_text(json.dumps(tokenizer)[:-1] + ', "x": ' + _nested(600) + "}")
    run = demo.cli("plan")  # the files not copied yet: the preflight reads the source's
    assert "internal error" not in run.output and "Traceback" not in run.output, run.output[-3000:]
    assert run.returncode == 2, run.output[-3000:]
    if where == "config.json":  # in the model dir (as the copy, or a hub's download, leaves it)
        shutil.copytree(source, demo.model_dir)
        run = demo.cli("plan")
        assert "internal error" not in run.output and "Traceback" not in run.output, run.output[-3000:]
        named = f"{demo.model_dir}/config.json: not valid JSON: JSON nested deeper than 64 levels"
        assert named in run.output and run.returncode == 2, run.output[-3000:]


# --- classes 4 and 6: the plan's own hub listing ---------------------------------------------------


def _listing(cache: Path, sha: str) -> subprocess.CompletedProcess[str]:
    """The plan's listing (probes.hub.listing, as the preflight's weights rule asks it while the model is
    not on disk) twice, the second as every later plan (from the cache), from a hub answering `sha`."""
    _Hub.SHA = sha
    try:
        return with_hub(LISTING, str(cache))
    finally:
        _Hub.SHA = json.dumps(COMMIT)


def test_the_plans_hub_listing_takes_a_commit_of_forty_hex_digits_and_nothing_after_them(
    tmp_path: Path,
) -> None:
    """Round 11 made apply's listing (actions.model) refuse a hub's `"sha": "<40 hex>\\n"`, but the
    plan's own listing (probes.hub) kept its copy of the pattern, `^[0-9a-f]{40}$`, whose `$` matches
    before a final newline. main (seen): the plan's listing took the commit, cached the branch's
    listing (`main.json`, its `commit` with the newline: the cache's reader takes any string), then
    ended in `ValueError: not a plain repo id or revision` naming the commit as a cache file name: every
    plan of a model not yet downloaded ended in that internal error while the hub answered so. Now every
    commit from outside is judged by one rule (`shapes.is_commit`: 40 hex digits, the whole string), the
    answer is the hub's bad answer, and nothing is cached."""
    cache = tmp_path / "cache"
    run = _listing(cache, json.dumps(COMMIT + "\n"))
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert len(lines) == 2 and all(
        line.startswith("listing: Unavailable ''  the hub answered without a commit for o/m@main")
        for line in lines
    ), run.stdout
    assert [p.name for p in cache.rglob("*.json")] == [], "a commit with a newline was cached"
    good = _listing(tmp_path / "good", json.dumps(COMMIT))  # the control: a plain sha is listed
    assert good.stdout.splitlines() == [
        f"listing: HubListing {COMMIT!r} False ",
        f"listing: HubListing {COMMIT!r} True ",
    ], good.stdout + good.stderr


def test_a_cached_listing_whose_commit_is_not_a_commit_is_moved_aside(tmp_path: Path) -> None:
    """The same listing already in the cache (written by main, or damaged): main (seen) read it back
    (`HUB_LISTING`'s commit was any string) and answered every plan from it for a day, the newline in
    its commit. Now its reader holds the commit to `shapes.is_commit`'s rule: moved aside with one line,
    the hub asked again."""
    repo_dir = tmp_path / "cache" / "o__m"
    repo_dir.mkdir(parents=True, mode=0o700)
    data = {"repo": "o/m", "revision": "main", "commit": COMMIT + "\n", "sizes": {"model.safetensors": 5}}
    (repo_dir / "main.json").write_text(json.dumps(data))
    run = _listing(tmp_path / "cache", json.dumps(COMMIT))
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert run.stdout.splitlines() == [
        f"listing: HubListing {COMMIT!r} False ",
        f"listing: HubListing {COMMIT!r} True ",
    ], run.stdout
    assert any(".corrupt-" in p.name for p in repo_dir.iterdir()), list(repo_dir.iterdir())


@pytest.mark.parametrize("kind", ["failed-note", "branch-listing"])
def test_a_hub_cache_entry_dated_in_the_future_is_not_fresh(tmp_path: Path, kind: str) -> None:
    """The hub cache judges an entry's age by its mtime: a failure note is fresh for 15 minutes (the hub
    is not asked again meanwhile), a branch's listing for a day. An mtime in the future (the clock stepped
    back after it was written: an RTC that ran ahead, a hand `touch`) made the age negative, and so
    fresh until the clock caught up. main (seen): a note dated a day ahead answered every plan with
    `(asked less than 15 minutes ago)` and the hub was never asked; a branch's listing dated a day
    ahead kept its old commit past its day. Now an entry dated ahead of now is stale: the hub is asked."""
    repo_dir = tmp_path / "cache" / "o__m"
    repo_dir.mkdir(parents=True, mode=0o700)
    if kind == "failed-note":
        entry = repo_dir / "main.json.failed"
        entry.write_text("the hub did not list o/m@main: 503")
        old = COMMIT
    else:
        entry = repo_dir / "main.json"
        old = "b" * 40
        data = {"repo": "o/m", "revision": "main", "commit": old, "sizes": {"model.safetensors": 5}}
        entry.write_text(json.dumps(data))
    ahead = time.time() + 2 * 86400
    os.utime(entry, (ahead, ahead))
    run = _listing(tmp_path / "cache", json.dumps(COMMIT))
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert run.stdout.splitlines()[0] == f"listing: HubListing {COMMIT!r} False ", (old, run.stdout)


# --- class 6: a state writer carrying a damaged value its own reader refuses ------------------------


@pytest.mark.parametrize("moment", ["1e400", "-5", "1e300", "nan"])
def test_a_damaged_textfile_moment_is_never_carried_into_a_last_run_its_reader_moves_aside(
    demo: Demo, moment: str
) -> None:
    """The `--textfile` is read for the counters and the last success when no last-run.json is known;
    its counters were held to finite counts (round 5), its last success to nothing: any float. main
    (seen): `reconcile_last_success_timestamp_seconds 1e400` (a hand edit, another tool) was carried into
    last-run.json as `Infinity` by every run that did not succeed, and the next run's reader (TIME)
    moved it aside: a `.corrupt-` file and a note every run, for as long as the runs failed, which is
    when the counters matter. Now a moment the state's TIME shape refuses is no last success (none
    kept), and last-run.json is written only when its reader takes it back (`statefiles.unreadable`)."""
    demo.spec_path.write_text(
        demo.spec_path.read_text().replace("max-model-len = 2048", "max-model-len = 99999999")
    )
    textfile = demo.root / "prom" / "reconcile.prom"
    textfile.parent.mkdir()
    textfile.write_text(
        f'reconcile_runs_total{{outcome="failed"}} 7\nreconcile_last_success_timestamp_seconds {moment}\n'
    )
    for _ in range(3):  # each run fails (a preflight error): its last success is the previous one's
        run = demo.cli("plan", "--scheduled", "--textfile", str(textfile))
        assert run.returncode == 1 and "internal error" not in run.output, run.output[-3000:]
        assert "moved aside" not in run.output, run.output[-3000:]
    assert [p.name for p in demo.state_dir.iterdir() if ".corrupt-" in p.name] == []
    last = json.loads(demo.last_run.read_text())
    assert last["last_success_timestamp"] is None and last["counters"]["runs_total"]["failed"] == 10, last


@pytest.fixture
def seeded(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    yield from demo_in(tmp_path, seed_venv(tmp_path_factory.getbasetemp(), {"ninja": "*"}))


def test_failed_starts_dated_ahead_of_now_do_not_hold_the_server_down(seeded: Demo) -> None:
    """The crash-loop guard counts the failed starts of the server record's history whose `at` is within
    `[server.crash_loop] window` of now: `at > now - window`, which every moment ahead of now passes.
    main (seen): three failed starts dated a year ahead (written while the clock ran ahead -- an RTC set
    wrong, corrected by NTP since -- or a hand edit; TIME takes up to 9999) held every apply for that
    year: `not starting it again before <HH:MM:SS>`, a time of day a year away. Now a start dated ahead
    of now is not within the window (the same rule as the hub cache's ages): the server starts, and
    failures from then on are counted on the clock the guard reads."""
    first = seeded.cli("apply", "--auto-approve")
    assert first.returncode in (0, 2), first.output[-3000:]
    stop_servers(seeded)
    record_path = seeded.state_dir / f"server-{seeded.name}.json"
    record = json.loads(record_path.read_text())
    ahead = time.time() + 365 * 86400
    failed = {"at": ahead, "pid": 4242, "identity": "x", "outcome": "failed", "reason": "exited 1"}
    record["history"] = [*record["history"], failed, failed, failed]
    record_path.write_text(json.dumps(record))
    run = seeded.cli("apply", "--auto-approve")
    assert "not starting it again" not in run.output, run.output[-3000:]
    assert run.returncode in (0, 2) and seeded.server_pids(), run.output[-3000:]


# --- class 6: a model's dimension of zero ----------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"), [("num_attention_heads", "0"), ("hidden_size", "0"), ("head_dim", "0.5")]
)
def test_a_model_dimension_below_one_is_one_finding_never_a_division_by_zero(
    tmp_path: Path, key: str, value: str
) -> None:
    """Rounds 10 and 11 judged a model's numbers by magnitude (`outlandish_number`: finite, within
    SIZE_MAX either way); zero is within. main (seen): a config.json (a hub repo's, or a source tree's of
    another user) with `num_attention_heads: 0`, `hidden_size: 0` or `head_dim: 0.5` ended every plan of
    that model in `ZeroDivisionError` (the memory rule's KV blocks: `available // block_bytes`, a head
    of 0 bytes; `hidden // heads`). Now a size or count the shape reads (`vllm.shape.config_int`: layers,
    heads, hidden size, head dim, Mamba's dims) below 1 is the model's bad file: the memory rule says
    it is not checked and names the key, and the plan goes on."""
    run = _plan(tmp_path, "config.json", key, value)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert (
        f"memory.fit | memory not checked: config.json gives {key} {json.loads(value)!r}: " in run.stdout
    ), run.stdout


def test_a_log_offset_past_any_file_never_ends_the_wait_for_a_loading_server_in_an_internal_error(
    seeded: Demo,
) -> None:
    """The server record's `log_offset` (where this start's lines begin in `[server] log`) was an integer
    >= 0 with no upper bound; the wait for a server still loading reads the log from it
    (`launching.read_log`: `f.seek(offset)`), and a seek past off_t raises OverflowError, which no caller
    expects. main (seen): an apply killed while the server loads (a timer's apply stopped by systemd; the
    server lives on in its own session and cgroup), the record's `log_offset` damaged to 2**64, and the
    next apply, finding the server of the same identity still loading, failed at its first progress
    line: `✗ server failed: the action crashed: ValueError: cannot fit 'int' into an offset-sized
    integer (a bug)`, exit 4, and so every apply while the server loaded. Now an offset is a file's
    offset (`shapes.SIZE`): past it the record is moved aside with one line (the cgroup still proves
    the server), and the apply goes on."""
    apply_killed_while_loading(seeded, 20, "--auto-approve")
    record_path = seeded.state_dir / f"server-{seeded.name}.json"
    record = json.loads(record_path.read_text())
    record["log_offset"] = 2**64
    record_path.write_text(json.dumps(record))
    run = seeded.cli("apply", "--auto-approve", timeout=300)
    assert "internal error" not in run.output and "Traceback" not in run.output, run.output[-3000:]
    assert run.returncode in (0, 2) and seeded.server_pids(), run.output[-3000:]
