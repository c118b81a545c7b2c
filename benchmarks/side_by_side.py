"""`reconcile plan` vs `ansible-playbook --check` vs `pyinfra --dry`: the same checks of the converged demo.

Run: python3 benchmarks/side_by_side.py [--rounds 10] [--skip-drift]
Needs the demo applied (`reconcile apply --spec specs/cpu-demo.toml`: paths under /tmp/reconcile-demo, the
server on port 18000). ansible-core and pyinfra are installed from PyPI into benchmarks/.venvs/tools on
first use; reconcile runs from a non-editable install in benchmarks/.venvs/reconcile (spec cache warm).
First each tool must find the demo converged, then find each of three drifts made on purpose (key mode,
config.json content, ninja gone from the venv; each undone at once), so no tool is timed on checks that
cannot fail. Then rounds of A B C (one untimed warm-up each), and the medians and ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from benchenv import DEMO_SPEC, HERE, REPO, clean_env, machine, reconcile_venv, tools_venv, versions

ROOT = Path("/tmp/reconcile-demo")
TARGETS = {"ansible-playbook --check": 10.0, "pyinfra --dry": 3.0}


@dataclass(frozen=True)
class Outcome:
    wall: float
    cpu: float
    changes: int  # what the tool says it would change (0: converged)
    output: str


@dataclass(frozen=True)
class Tool:
    name: str
    argv: list[str]
    env: dict[str, str]
    count: Callable[[int, str, str], int]  # (exit code, stdout, stderr) -> changes; raises when it failed

    def run(self) -> Outcome:
        started = time.perf_counter()
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(
                self.argv, env=self.env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=out, stderr=err
            )
            _, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - started
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
        code = os.waitstatus_to_exitcode(status)
        try:
            changes = self.count(code, stdout, stderr)
        except ValueError as exc:
            sys.exit(f"side_by_side: {self.name} failed ({exc}):\n{stdout[-3000:]}\n{stderr[-3000:]}")
        return Outcome(wall, usage.ru_utime + usage.ru_stime, changes, stdout + stderr)


def _reconcile_changes(code: int, stdout: str, stderr: str) -> int:
    if code not in (0, 2):
        raise ValueError(f"exit {code}")
    plan = json.loads(stdout)
    return len([r for r in plan["resources"] if r.get("status") != "ok"])


def _ansible_changes(code: int, stdout: str, stderr: str) -> int:
    recap = [ln for ln in stdout.splitlines() if ln.startswith("localhost") and "changed=" in ln]
    if not recap:
        raise ValueError(f"exit {code}, no PLAY RECAP")
    fields = dict(part.split("=") for part in recap[-1].split(":", 1)[1].split())
    if int(fields["unreachable"]):
        raise ValueError("unreachable")
    # A failed assert (or /health not 200) is how a playbook reports drift it has no module for.
    return int(fields["changed"]) + int(fields["failed"])


def _pyinfra_changes(code: int, stdout: str, stderr: str) -> int:
    if code != 0:
        raise ValueError(f"exit {code}")
    plan = json.loads(stdout)["plan"]
    return sum(1 for op in plan if op["hosts_with_change"] or op["hosts_with_conditional_change"])


def tools(reconcile: Path, bin_dir: Path, cache_home: str) -> list[Tool]:
    return [
        Tool(
            "reconcile plan",
            [str(reconcile), "plan", "--json", "--spec", str(DEMO_SPEC.relative_to(REPO))],
            clean_env(XDG_CACHE_HOME=cache_home),
            _reconcile_changes,
        ),
        Tool(
            "ansible-playbook --check",
            [str(bin_dir / "ansible-playbook"), "--check", str(HERE / "ansible" / "cpu-demo-check.yml")],
            clean_env(
                ANSIBLE_CONFIG=str(HERE / "ansible" / "ansible.cfg"),
                ANSIBLE_NOCOLOR="1",
                ANSIBLE_LOCAL_TEMP=os.path.join(cache_home, "ansible-local"),
            ),
            _ansible_changes,
        ),
        Tool(
            "pyinfra --dry",
            [
                str(bin_dir / "pyinfra"),
                "@local",
                str(HERE / "pyinfra" / "cpu_demo_check.py"),
                "--dry",
                "--json",
            ],
            clean_env(),
            _pyinfra_changes,
        ),
    ]


# Each drift yields a check that it is still in place: the demo is shared, and an apply run by someone
# else meanwhile undoes it (then that drift is tried again).
@contextlib.contextmanager
def key_mode_0644() -> Iterator[Callable[[], bool]]:
    key = ROOT / "api.key"
    os.chmod(key, 0o644)
    try:
        yield lambda: key.stat().st_mode & 0o777 == 0o644
    finally:
        os.chmod(key, 0o600)


@contextlib.contextmanager
def config_changed() -> Iterator[Callable[[], bool]]:
    config = ROOT / "models" / "demo" / "config.json"
    saved = config.with_name(".config.json.side-by-side")
    shutil.copy2(config, saved)
    try:
        doc = json.loads(config.read_text())
        doc["rope_parameters"]["factor"] = 3.0
        changed = json.dumps(doc, indent=2) + "\n"
        config.write_text(changed)
        yield lambda: config.read_text() == changed
    finally:
        os.replace(saved, config)


@contextlib.contextmanager
def ninja_gone() -> Iterator[Callable[[], bool]]:
    site = next((ROOT / "venv" / "lib").glob("python3.*/site-packages"))
    dist = next(site.glob("ninja-*.dist-info"))
    hidden = dist.with_name("." + dist.name + ".side-by-side")
    os.rename(dist, hidden)
    try:
        yield lambda: not dist.exists()
    finally:
        os.rename(hidden, dist)


DRIFTS: list[tuple[str, Callable[[], contextlib.AbstractContextManager[Callable[[], bool]]]]] = [
    ("key file mode 0644", key_mode_0644),
    ("config.json rope factor 3.0", config_changed),
    ("ninja's dist-info gone", ninja_gone),
]


def check_all(all_tools: list[Tool], skip_drift: bool) -> None:
    for tool in all_tools:
        seen = tool.run()
        if seen.changes:
            sys.exit(
                f"side_by_side: {tool.name} finds {seen.changes} change(s): the demo is not converged; "
                f"apply it first.\n{seen.output[-3000:]}"
            )
    if skip_drift:
        return
    for what, drift in DRIFTS:
        for _ in range(3):
            with drift() as still:
                found = {tool.name: tool.run().changes for tool in all_tools}
                if still():
                    break
            print(f"drift '{what}' was undone by someone else while measured: again", flush=True)
        print(f"drift '{what}': " + ", ".join(f"{n} sees {c}" for n, c in found.items()), flush=True)
        blind = [n for n, c in found.items() if not c]
        if blind:
            sys.exit(
                f"side_by_side: {', '.join(blind)} did not see the drift '{what}': "
                "its checks are not the same"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--skip-drift", action="store_true", help="skip the three drifts made on purpose")
    args = parser.parse_args()
    reconcile, bin_dir = reconcile_venv(), tools_venv()
    with tempfile.TemporaryDirectory(prefix="side-by-side-") as cache_home:
        all_tools = tools(reconcile, bin_dir, cache_home)
        check_all(all_tools, args.skip_drift)
        for tool in all_tools:
            tool.run()  # warm-up: the spec cache, Ansible's and pyinfra's own first-run work, the page cache
        load_before = os.getloadavg()[0]
        samples: dict[str, list[Outcome]] = {t.name: [] for t in all_tools}
        for _ in range(args.rounds):
            for tool in all_tools:
                samples[tool.name].append(tool.run())
        load_after = os.getloadavg()[0]
    tool_versions = versions(bin_dir)
    print(
        f"\nmachine: {machine()}\ndate: {time.strftime('%Y-%m-%d %H:%M %Z')}; load average "
        f"{load_before:.2f} before, {load_after:.2f} after\n"
        f"ansible-core {tool_versions['ansible-core']}, pyinfra {tool_versions['pyinfra']}; "
        f"{args.rounds} rounds of A B C; every run found 0 changes\n"
    )
    ours = samples["reconcile plan"]
    wall0 = statistics.median(s.wall for s in ours)
    cpu0 = statistics.median(s.cpu for s in ours)
    print("| tool | median wall s | median CPU s | wall / reconcile | CPU / reconcile | target |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for name, runs in samples.items():
        if any(s.changes for s in runs):
            sys.exit(
                f"side_by_side: {name} found changes during the timed rounds (something else moved the demo)"
            )
        wall = statistics.median(s.wall for s in runs)
        cpu = statistics.median(s.cpu for s in runs)
        target = TARGETS.get(name)
        verdict = "" if target is None else f"≥ {target:g}x: {'met' if wall / wall0 >= target else 'MISSED'}"
        print(f"| {name} | {wall:.3f} | {cpu:.3f} | {wall / wall0:.1f}x | {cpu / cpu0:.1f}x | {verdict} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
