"""How long `reconcile rollback N` takes with the network unreachable, apart from the server's restart.

Runs itself inside `unshare -n` (a network namespace with only loopback up: no route, no DNS) when
it can. Two generations of the demo spec whose venvs are realized under a store from a local
wheelhouse (tinyserve 1.0 / 2.0, built here); the wheelhouse is then moved away and every index and
proxy pointed at a closed port, and the script switches 1 -> 2 -> 1 ... `--rounds` times.
Per switch it prints the wall time of the command, the server step (stop the old server, start
the new one, wait for /health; from the apply journal) and the rest: what rollback itself costs.

`--site-files N` adds an extra site-packages of N files in 150 distributions (`[venv]
extra_site_packages`, as the H200 lab's torch environment is: the path rule walks it whole).
`--versus DIR` runs every other round with the reconcile in DIR (a checkout of another commit, e.g.
`git archive main | tar -x -C DIR`), interleaved, and prints each one's median and their ratio.
Each round's phases (reconcile.apply.phases, from the journal) are printed when it has them.

    .venv/bin/python benchmarks/bench_rollback.py [--rounds 6] [--site-files N] [--versus DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.apply_support import Demo, stop_servers  # noqa: E402
from tests.generations_support import build_wheelhouse, offline_env, realizations, stored_spec  # noqa: E402
from tests.test_server_support import free_port  # noqa: E402

INSIDE = "BENCH_ROLLBACK_NETNS"


def _netns() -> None:
    """Run again in a new network namespace with loopback up (root), unless already there."""
    if os.environ.get(INSIDE) or not shutil.which("unshare") or not shutil.which("ip"):
        return
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True)
    if probe.returncode != 0:
        print("bench_rollback: unshare -n not permitted: proxies and indexes only", file=sys.stderr)
        return
    cmd = "ip link set lo up && exec " + " ".join([sys.executable, *map(_quote, sys.argv)])
    os.environ[INSIDE] = "1"
    os.execvp("unshare", ["unshare", "-n", "sh", "-c", cmd])


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def _journal(demo: Demo) -> dict[str, object]:
    """The newest apply journal entry: its changes (the server step: stop, start, /health) and phases."""
    journal = demo.state_dir / "generations"
    newest = max((p for p in journal.glob("*.json") if p.stem.isdigit()), key=lambda p: int(p.stem))
    data: dict[str, object] = json.loads(newest.read_text())
    return data


def _server_seconds(entry: dict[str, object]) -> float:
    changes = entry["changes"]
    assert isinstance(changes, list)
    return sum(float(c["seconds"]) for c in changes if c["resource"] == "server")


def _site_packages(top: Path, files: int, dists: int = 150) -> None:
    """A site-packages of `files` small files in `dists` distributions (dist-info and a package each)."""
    per = max(1, files // dists)
    for d in range(dists):
        name = f"pad{d:03d}"
        info = top / f"{name}-1.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n\n")
        for i in range(per):
            sub = top / name / f"m{i // 20:03d}"
            sub.mkdir(parents=True, exist_ok=True)
            (sub / f"f{i}.py").write_text("x = 1\n")


def _command(demo: Demo, versus: str | None, *args: str) -> list[str]:
    """The CLI: this checkout's, or (versus) the one in that directory, first on sys.path."""
    if versus is None:
        return demo.command(*args)
    boot = f"import sys; sys.path.insert(0, {versus!r}); from reconcile.cli import main; sys.exit(main())"
    return [sys.executable, "-c", boot, *args, "--spec", str(demo.spec_path)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--json", metavar="OUT")
    parser.add_argument("--site-files", type=int, default=0, metavar="N")
    parser.add_argument("--versus", metavar="DIR")
    args = parser.parse_args()
    _netns()
    root = Path(tempfile.mkdtemp(prefix="bench-rollback-"))
    demo = Demo(root, f"bench-{uuid.uuid4().hex[:8]}", free_port())
    try:
        wheels = build_wheelhouse(root / "build")
        site = root / "site-packages"
        if args.site_files:
            _site_packages(site, args.site_files)
        for version, seqs in (("1.0", 4), ("2.0", 8)):
            path = stored_spec(
                demo, wheels, version, args={"max-num-seqs": seqs}, config={"attention_dropout": 0.1}
            )
            if args.site_files:
                text = path.read_text()
                path.write_text(text.replace("[venv]\n", f'[venv]\nextra_site_packages = ["{site}"]\n', 1))
            done = demo.cli("apply")
            if done.returncode != 2:
                sys.exit(f"apply {version} failed:\n{done.output}")
        shutil.move(str(wheels), str(root / "wheels-away"))
        env = offline_env(demo)
        rows = []
        for i in range(args.rounds):
            target = 1 if i % 2 == 0 else 2
            versus = args.versus if args.versus and i % 4 in (1, 2) else None  # ABBA: neither goes first
            started = time.monotonic()
            proc = subprocess.run(
                _command(demo, versus, "rollback", str(target)),
                capture_output=True,
                text=True,
                env=env,
                cwd=str(root),
            )
            wall = time.monotonic() - started
            if proc.returncode != 2:
                sys.exit(f"rollback {target} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
            entry = _journal(demo)
            server = _server_seconds(entry)
            rows.append(
                {
                    "to": target,
                    "code": "versus" if versus else "this",
                    "wall_s": wall,
                    "server_step_s": server,
                    "rollback_s": wall - server,
                    "phases": entry.get("phases"),
                }
            )
            print(
                f"{'versus' if versus else 'this'}: rollback to {target}: {wall:.2f} s wall, server step "
                f"{server:.2f} s, rollback itself {wall - server:.2f} s"
                + (f"\n  phases: {entry['phases']}" if entry.get("phases") else "")
            )
        summary = {
            "network": "unshare -n (loopback only)" if os.environ.get(INSIDE) else "proxies/indexes closed",
            "realizations": len(realizations(demo)),
            "median_wall_s": statistics.median(r["wall_s"] for r in rows),
            "median_server_step_s": statistics.median(r["server_step_s"] for r in rows),
            "median_rollback_s": statistics.median(r["rollback_s"] for r in rows),
            "max_rollback_s": max(r["rollback_s"] for r in rows),
            "load_average": os.getloadavg(),
            "rounds": rows,
        }
        print(
            f"\nmedian of {args.rounds} ({summary['network']}): {summary['median_wall_s']:.2f} s wall = "
            f"{summary['median_server_step_s']:.2f} s server step + {summary['median_rollback_s']:.2f} s "
            f"rollback (max {summary['max_rollback_s']:.2f} s); load {os.getloadavg()[0]:.1f}"
        )
        if args.versus:
            own = {
                code: statistics.median(r["rollback_s"] for r in rows if r["code"] == code)
                for code in ("this", "versus")
            }
            summary["median_rollback_s_by_code"] = own
            summary["ratio_this_over_versus"] = own["this"] / own["versus"]
            print(
                f"rollback itself, median: this {own['this']:.2f} s, versus ({args.versus}) "
                f"{own['versus']:.2f} s: {own['this'] / own['versus']:.3f}x"
            )
        if args.json:
            Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    finally:
        stop_servers(demo)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
