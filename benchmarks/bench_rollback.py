"""How long `reconcile rollback N` takes with the network unreachable, apart from the server's restart.

Runs itself inside `unshare -n` (a network namespace with only loopback up: no route, no DNS) when
it can. Two generations of the demo spec whose venvs are realized under a store from a local
wheelhouse (tinyserve 1.0 / 2.0, built here); the wheelhouse is then moved away and every index and
proxy pointed at a closed port, and the script switches 1 -> 2 -> 1 ... `--rounds` times.
Per switch it prints the wall time of the command, the server step (stop the old server, start
the new one, wait for /health; from the apply journal) and the rest: what rollback itself costs.

    .venv/bin/python benchmarks/bench_rollback.py [--rounds 6] [--json OUT]
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


def _journal_server_seconds(demo: Demo) -> float:
    """The server step of the newest apply journal entry (stop, start, /health)."""
    journal = demo.state_dir / "generations"
    newest = max((p for p in journal.glob("*.json") if p.stem.isdigit()), key=lambda p: int(p.stem))
    changes = json.loads(newest.read_text())["changes"]
    return sum(float(c["seconds"]) for c in changes if c["resource"] == "server")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--json", metavar="OUT")
    args = parser.parse_args()
    _netns()
    root = Path(tempfile.mkdtemp(prefix="bench-rollback-"))
    demo = Demo(root, f"bench-{uuid.uuid4().hex[:8]}", free_port())
    try:
        wheels = build_wheelhouse(root / "build")
        for version, seqs in (("1.0", 4), ("2.0", 8)):
            stored_spec(demo, wheels, version, args={"max-num-seqs": seqs}, config={"attention_dropout": 0.1})
            done = demo.cli("apply")
            if done.returncode != 2:
                sys.exit(f"apply {version} failed:\n{done.output}")
        shutil.move(str(wheels), str(root / "wheels-away"))
        env = offline_env(demo)
        rows = []
        for i in range(args.rounds):
            target = 1 if i % 2 == 0 else 2
            started = time.monotonic()
            proc = subprocess.run(
                demo.command("rollback", str(target)), capture_output=True, text=True, env=env, cwd=str(root)
            )
            wall = time.monotonic() - started
            if proc.returncode != 2:
                sys.exit(f"rollback {target} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
            server = _journal_server_seconds(demo)
            rows.append({"to": target, "wall_s": wall, "server_step_s": server, "rollback_s": wall - server})
            print(
                f"rollback to {target}: {wall:.2f} s wall, server step {server:.2f} s, "
                f"rollback itself {wall - server:.2f} s"
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
        if args.json:
            Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    finally:
        stop_servers(demo)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
