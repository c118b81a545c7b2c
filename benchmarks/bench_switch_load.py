"""A switch and a rollback under the reference's load: 8 concurrent streams (new connection per
request, a refused one retried after 50 ms) run through `reconcile apply` of a changed spec and
`reconcile rollback`, on the CPU demo with the fake vLLM (which stops as vLLM 0.26.0 does).
Prints, per phase, whole requests, cut in-flight requests (an answer had started), failed requests,
and those the gap did not serve: refused connections and unanswered requests (reset before any
answer: queued on the closing listener); the gap (longest run from an attempt not served to the next
served one), plus apply's own "prepared in X s, down for Y s". tests/switch_load_support.py says how
each request is counted.

    .venv/bin/python benchmarks/bench_switch_load.py [--mode drain-restart|blue-green|blue-green-multi]
        [--tokens 150] [--token-s 0.02] [--startup-s 1.0] [--json OUT]

blue-green puts apt's haproxy in front ([front]); gpu-memory-utilization 0.4 lets both colors share
the fake's GPU, as on a GPU with room. blue-green-multi: two deployments (chat, draft) behind the
machine's one haproxy at 0.3 each, 4 streams on each; chat switches and rolls back, draft must not
notice (its counts, its pid).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.apply_support import Demo, stop_servers  # noqa: E402
from tests.switch_load_support import Load, stop_front  # noqa: E402
from tests.test_server_support import free_port, wait_for  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=150)
    parser.add_argument("--token-s", default="0.02")
    parser.add_argument("--startup-s", default="1.0", help="the fake vLLM's load time (the gap's floor)")
    parser.add_argument(
        "--mode", choices=("drain-restart", "blue-green", "blue-green-multi"), default="drain-restart"
    )
    parser.add_argument("--json", metavar="OUT")
    args = parser.parse_args()
    if args.mode == "blue-green-multi":
        return multi(args)
    demo = Demo(Path(tempfile.mkdtemp(prefix="bench-switch-")), f"bench-{uuid.uuid4().hex[:8]}", free_port())
    ports = [free_port(), free_port()]

    def spec(seqs: int) -> None:
        def edit(doc: Any) -> None:
            doc["server"]["args"]["max-num-seqs"] = seqs
            doc["server"]["env"]["FAKE_VLLM_TOKEN_S"] = args.token_s
            doc["server"]["env"]["FAKE_VLLM_STARTUP_DELAY"] = args.startup_s
            if args.mode == "blue-green":
                import tomlkit

                doc["server"]["args"]["gpu-memory-utilization"] = 0.4  # both colors fit the fake GPU
                doc["front"] = tomlkit.table()
                doc["front"]["ports"] = ports

        demo.write_spec(edit)

    def step(*cli: str) -> str:
        done = demo.cli(*cli)
        if done.returncode not in (0, 2):
            sys.exit(f"reconcile {' '.join(cli)} exited {done.returncode}:\n{done.output}")
        found = re.search(r"prepared in [\d.]+s.*?down for [\d.]+s", done.output)
        return found.group(0) if found else "(no switch line)"

    try:
        spec(8)
        step("apply")
        key = demo.key_file.read_text().strip()
        said = {}
        with Load(demo.port, key, demo.name, tokens=args.tokens) as load:
            wait_for(lambda: load.tally("before").ok >= 8, 60, "requests before the switch")
            load.phase = "switch"
            spec(9)
            said["switch"] = step("apply")
            load.phase = "after switch"
            wait_for(lambda: load.tally("after switch").ok >= 8, 60, "requests after the switch")
            load.phase = "rollback"
            said["rollback"] = step("rollback")
            load.phase = "after rollback"
            wait_for(lambda: load.tally("after rollback").ok >= 8, 60, "requests after the rollback")
        result = load.summary()
        result["apply_says"] = said
        result["setup"] = {"clients": 8, "tokens": args.tokens, "token_s": args.token_s,
                           "startup_s": args.startup_s, "mode": args.mode}  # fmt: skip
    finally:
        stop_servers(demo)
        stop_front(str(demo.spec_path))
    print(f"{'phase':<16}{'whole':>7}{'cut':>6}{'failed':>8}{'refused':>9}{'unanswered':>12}")
    for phase, t in result["phases"].items():  # type: ignore[union-attr]
        print(f"{phase:<16}{t['ok']:>7}{t['cut']:>6}{t['failed']:>8}{t['refused']:>9}{t['unanswered']:>12}")
    print(
        f"not served during the gap: {result['refused']} refused + {result['unanswered']} unanswered; "
        f"cut in flight: {result['cut']}; failed: {result['failed']}"
    )
    print(f"gap (not served -> next served, longest): {result['gap_s']} s")
    for what, line in said.items():
        print(f"{what}: {line}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["cut"] == 0 and result["failed"] == 0 else 1


def multi(args: argparse.Namespace) -> int:
    """Two deployments behind one HAProxy: chat switches (apply) and rolls back under load on both."""
    from tests.apply_support import copy_venv, seed_venv
    from tests.test_deployments import NAMES, Multi
    from tests.test_front_deployments import distinct_ports, fronted_spec, stop_all

    root = Path(tempfile.mkdtemp(prefix="bench-switch-multi-"))
    ports = distinct_ports(3 * len(NAMES))
    m = Multi(root, {name: ports.pop() for name in NAMES})
    colors = {name: [ports.pop(), ports.pop()] for name in NAMES}
    copy_venv(seed_venv(root / "seed", {"ninja": "*"}), root / "venv")

    def step(*cli: str) -> str:
        done = m.cli(*cli, "--auto-approve")
        if done.returncode not in (0, 2):
            sys.exit(f"reconcile {' '.join(cli)} exited {done.returncode}:\n{done.stdout}{done.stderr}")
        found = re.search(r"blue/green: .*?down for [\d.]+s", done.stdout)
        return found.group(0) if found else "(no blue/green line)"

    try:
        m.write(fronted_spec(colors, 0.3))
        step("apply")
        draft_pid = int((m.state_dir / "deployments/draft/draft-blue.pid").read_text().split()[0])
        loads = {
            name: Load(m.ports[name], m.key(name), name, clients=4, tokens=args.tokens) for name in NAMES
        }
        said = {}
        for load in loads.values():
            load.__enter__()
        try:
            for phase, cli in (
                ("switch", ("apply",)),
                ("rollback", ("rollback", "1", "--deployment", "chat")),
            ):
                for load in loads.values():
                    wait_for(lambda load=load: load.tally(load.phase).ok >= 4, 60, f"requests ({load.phase})")
                    load.phase = phase
                if phase == "switch":
                    m.write(fronted_spec(colors, 0.3, seqs=5))
                said[phase] = step(*cli)
                for load in loads.values():
                    load.phase = f"after {phase}"
            for load in loads.values():
                wait_for(lambda load=load: load.tally(load.phase).ok >= 4, 60, "requests after the rollback")
        finally:
            for load in loads.values():
                load.stop()
        kept = int((m.state_dir / "deployments/draft/draft-blue.pid").read_text().split()[0]) == draft_pid
    finally:
        stop_all(m)
    result: dict[str, Any] = {name: load.summary() for name, load in loads.items()}
    result["apply_says"], result["draft_pid_kept"] = said, kept
    for name, load in loads.items():
        print(f"deployment {name}")
        print(f"  {'phase':<16}{'whole':>7}{'cut':>6}{'failed':>8}{'refused':>9}{'unanswered':>12}")
        for phase, t in load.summary()["phases"].items():  # type: ignore[union-attr]
            row = f"{t['ok']:>7}{t['cut']:>6}{t['failed']:>8}{t['refused']:>9}{t['unanswered']:>12}"
            print(f"  {phase:<16}{row}")
    for what, line in said.items():
        print(f"chat {what}: {line}")
    print(f"draft's pid kept: {kept}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    bad = any(load.summary()[k] for load in loads.values() for k in ("cut", "failed", "unserved"))
    return 1 if bad or not kept else 0


if __name__ == "__main__":
    sys.exit(main())
