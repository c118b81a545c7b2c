"""The store's cost on the demo spec as a user has it (no store line): the time of each apply (A, then
B with one package changed, then B' with one model file edited in the local source, then a rollback
to A) and `du` of the realizations (the demo model plus a random `model.safetensors`, 64 MiB by
default), together (hard links counted once) and apart (`du -l`).

    .venv/bin/python benchmarks/bench_store.py [--weights-mib 64] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import tomlkit  # noqa: E402

from tests.apply_support import DEMO_MODEL, Demo, stop_servers  # noqa: E402
from tests.generations_support import build_wheelhouse  # noqa: E402
from tests.test_server_support import free_port  # noqa: E402


def _du(*paths: Path, apart: bool = False) -> float:
    out = subprocess.run(["du", "-s", "-B1", *(["-l"] if apart else []), *map(str, paths)],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return sum(int(line.split()[0]) for line in out.splitlines()) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--weights-mib", type=int, default=64, help="a random model.safetensors of this size")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-store-"))
    wheels = build_wheelhouse(base)
    source = base / "demo-model-src"
    shutil.copytree(DEMO_MODEL, source)
    if args.weights_mib:
        (source / "model.safetensors").write_bytes(os.urandom(args.weights_mib << 20))
    demo = Demo(base / "demo", f"bench-{uuid.uuid4().hex[:8]}", free_port())

    def spec(version: str) -> None:
        def edit(doc: Any) -> None:
            doc["venv"]["wheelhouse"] = str(wheels)
            doc["venv"]["installer"] = "pip"
            packages = tomlkit.inline_table()
            packages.update({"tinyserve": f"=={version}"})
            doc["venv"]["packages"] = packages
            doc["model"]["source"] = str(source)
            del doc["server"]["executable"]

        demo.write_spec(edit)

    def timed(*argv: str) -> float:
        started = time.monotonic()
        run = demo.cli(*argv)
        assert run.returncode in (0, 2), run.output
        return round(time.monotonic() - started, 2)

    figures: dict[str, Any] = {}
    try:
        spec("1.0")
        figures["apply A (venv built, model copied)"] = timed("apply")
        figures["apply A again (nothing to do)"] = timed("apply")
        spec("2.0")
        figures["apply B (one package)"] = timed("apply")
        path = source / "tokenizer_config.json"
        path.write_text(path.read_text().replace("true", "TRUE", 1))
        figures["apply B' (a model file edited)"] = timed("apply")
        figures["rollback 1 (to A)"] = timed("rollback", "1")
        store = demo.state_dir / "store"
        venvs = sorted(store.glob("*-venv"))
        models = sorted(store.glob("*-model"))
        figures["du venvs together MiB"] = round(_du(*venvs), 2)
        figures["du venvs apart MiB"] = round(_du(*venvs, apart=True), 2)
        figures["du models together (+hub) MiB"] = round(_du(*models, store / "hub"), 3)
        figures["du models apart MiB"] = round(_du(*models, apart=True), 3)
    finally:
        stop_servers(demo)
        shutil.rmtree(base, ignore_errors=True)
    for key, value in figures.items():
        print(f"{key}: {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
