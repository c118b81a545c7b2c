"""Benchmark: pip vs uv installing the same small set into fresh venvs (what [venv].installer="auto" follows).

Run: .venv/bin/python benchmarks/uv_vs_pip.py [--rounds 3] [--python PY]
Each round makes two fresh venvs and times only the install; median of the rounds, with warm caches
(the usual re-apply) and with caches off (first apply on a new machine, downloads included).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

PACKAGES = ["ninja", "six", "attrs"]


def find_uv() -> str | None:
    return shutil.which("uv") or next(
        (p for p in [os.path.join(os.path.dirname(sys.executable), "uv")] if os.access(p, os.X_OK)), None
    )


def fresh_venv(python: str, parent: str, name: str) -> str:
    path = os.path.join(parent, name)
    subprocess.run([python, "-m", "venv", path], check=True, capture_output=True)
    return path


def timed(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, env={**os.environ, "PIP_NO_INPUT": "1"})
    return time.perf_counter() - started


def install_argv(installer: str, venv: str, uv: str, cache: bool) -> list[str]:
    python = os.path.join(venv, "bin", "python")
    if installer == "uv":
        return [uv, "pip", "install", "--python", python, *([] if cache else ["--no-cache"]), *PACKAGES]
    return [
        python,
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        *([] if cache else ["--no-cache-dir"]),
        *PACKAGES,
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--python", default=sys.executable, help="interpreter the venvs are made from")
    args = parser.parse_args()
    uv = find_uv()
    if uv is None:
        print("uv not found (on PATH or beside this python): nothing to compare; auto uses pip")
        return 1
    version = subprocess.run([uv, "--version"], capture_output=True, text=True).stdout.strip()
    times: dict[tuple[str, bool], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="uv-vs-pip-") as parent:
        for installer in ("pip", "uv"):  # warm each cache once, untimed
            warm = fresh_venv(args.python, parent, f"warm-{installer}")
            timed(install_argv(installer, warm, uv, cache=True))
        pip_version = subprocess.run(
            [os.path.join(warm, "bin", "python"), "-m", "pip", "--version"], capture_output=True, text=True
        ).stdout.split(" from ")[0]
        print(f"{version}; {pip_version} (the venvs' own); {os.cpu_count()} cores; {' '.join(PACKAGES)}")
        for n in range(args.rounds):
            for cache in (True, False):
                for installer in ("pip", "uv"):
                    venv = fresh_venv(args.python, parent, f"{installer}-{cache}-{n}")
                    times.setdefault((installer, cache), []).append(
                        timed(install_argv(installer, venv, uv, cache))
                    )
                    shutil.rmtree(venv)

    print(f"\n{'installer':<10} {'cache':<6} {'median s':>9}  runs (s)")
    for (installer, cache), runs in times.items():
        print(
            f"{installer:<10} {'warm' if cache else 'off':<6} {statistics.median(runs):>9.2f}  "
            + " ".join(f"{r:.2f}" for r in runs)
        )
    for cache in (True, False):
        pip_s, uv_s = (statistics.median(times[(i, cache)]) for i in ("pip", "uv"))
        verdict = "faster" if uv_s < pip_s else "SLOWER"
        print(f"{'warm' if cache else 'no'} cache: uv is {pip_s / uv_s:.1f}x {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
