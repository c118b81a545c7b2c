"""How `reconcile plan` grows with the spec: 1x, 10x and 100x, 100x being 300 apt packages, 500 venv packages
and 50 config.json keys (1x: 3, 5 and 1).

Run: python3 benchmarks/scale.py [--runs 10]
Every spec is converged, so what grows is the probes' and planners' work, not the drift rendering: its apt
packages are ones dpkg says are installed here; its venv is a real `python -m venv --without-pip` holding
one fake `*.dist-info/METADATA` per package (the venv probe reads METADATA only, never runs pip); its model
dir and config patch are made by one real `reconcile apply` before timing. Times are of the console script
of benchmarks/.venvs/reconcile (a new process per run), spec cache warm and cold, medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_plan import Sample, timed
from benchenv import clean_env, machine, reconcile_venv

# scale -> (apt packages, venv packages, config.json keys in the patch)
SIZES = {1: (3, 5, 1), 10: (30, 50, 5), 100: (300, 500, 50)}


def installed_packages() -> list[str]:
    out = subprocess.run(
        ["dpkg-query", "-W", "-f=${Package}\\t${db:Status-Status}\\n"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted(
        {name for name, _, status in (ln.partition("\t") for ln in out.splitlines()) if status == "installed"}
    )


def fake_venv(path: Path, count: int) -> dict[str, str]:
    """A real venv (no pip) with `count` distributions that exist only as METADATA; their spec entries."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    site = next((path / "lib").glob("python3.*/site-packages"))
    wanted = {}
    for n in range(count):
        name, version = f"scale-pkg-{n:04d}", f"1.{n % 7}.{n}"
        dist = site / f"scale_pkg_{n:04d}-{version}.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nA fake.\n"
        )
        # A mix of what specs hold: any version, a pin, a range (the planner parses each).
        wanted[name] = ("*", f"=={version}", ">=1.0,<2")[n % 3]
    return wanted


def make_spec(root: Path, apt: list[str], venv_packages: dict[str, str], keys: int) -> Path:
    source = root / "model-source"
    source.mkdir()
    (source / "config.json").write_text(
        '{\n  "architectures": ["LlamaForCausalLM"],\n  "max_position_embeddings": 2048\n}\n'
    )
    lines = [f'[machine]\nstate_dir = "{root}/state"\n', "[apt]\npackages = ["]
    lines += [f'  "{name}",' for name in apt]
    lines += ["]\n", f'[venv]\npath = "{root}/venv"\n', "[venv.packages]"]
    lines += [f'"{name}" = "{spec}"' for name, spec in venv_packages.items()]
    lines += ["", f'[model]\nsource = "{source}"\ndir = "{root}/model"\n', "[model.config]"]
    lines += [f"scale_key_{n:03d} = {n}" for n in range(keys)]
    spec = root / "scale.toml"
    spec.write_text("\n".join(lines) + "\n")
    return spec


def measure(reconcile: Path, spec: Path, runs: int) -> tuple[list[Sample], list[Sample]]:
    argv = [str(reconcile), "plan", "--spec", str(spec)]
    with tempfile.TemporaryDirectory(prefix="scale-cache-") as home:
        env = clean_env(XDG_CACHE_HOME=home)
        first = timed(argv, env)
        if first.code != 0:
            sys.exit(f"scale: {spec} is not converged after apply (plan exit {first.code})")
        warm = [timed(argv, env) for _ in range(runs)]
    cold = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="scale-cache-") as home:
            cold.append(timed(argv, clean_env(XDG_CACHE_HOME=home)))
    return warm, cold


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    reconcile = reconcile_venv()
    available = installed_packages()
    rows = []
    with tempfile.TemporaryDirectory(prefix="reconcile-scale-") as tmp:
        for scale, (n_apt, n_venv, n_keys) in SIZES.items():
            if len(available) < n_apt:
                sys.exit(f"scale: only {len(available)} packages installed here, {n_apt} needed")
            root = Path(tmp) / f"x{scale}"
            root.mkdir()
            spec = make_spec(root, available[:n_apt], fake_venv(root / "venv", n_venv), n_keys)
            applied = subprocess.run(
                [str(reconcile), "apply", "--spec", str(spec)],
                capture_output=True,
                text=True,
                env=clean_env(XDG_CACHE_HOME=str(root / "cache")),
            )
            if applied.returncode not in (0, 2):
                sys.exit(
                    f"scale: apply of {spec} exited {applied.returncode}:\n{applied.stdout}{applied.stderr}"
                )
            warm, cold = measure(reconcile, spec, args.runs)
            rows.append((scale, n_apt, n_venv, n_keys, os.path.getsize(spec), warm, cold))
            print(f"x{scale} done", file=sys.stderr, flush=True)
    print(
        f"machine: {machine()}\ndate: {time.strftime('%Y-%m-%d %H:%M %Z')}; "
        f"load average {os.getloadavg()[0]:.2f}\n"
    )
    print(f"`reconcile plan` of a converged generated spec, median of {args.runs} (ms)\n")
    print(
        "| size | apt pkgs | venv pkgs | config keys | spec bytes | warm wall | warm CPU | cold wall "
        "| cold CPU |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    base = None
    for scale, n_apt, n_venv, n_keys, size, warm, cold in rows:
        w = statistics.median(s.wall for s in warm)
        wc = statistics.median(s.cpu for s in warm)
        c = statistics.median(s.wall for s in cold)
        cc = statistics.median(s.cpu for s in cold)
        base = base or (w, c)
        print(
            f"| {scale}x | {n_apt} | {n_venv} | {n_keys} | {size:,} | {w * 1000:.0f} | {wc * 1000:.0f} "
            f"| {c * 1000:.0f} | {cc * 1000:.0f} |"
        )
    assert base is not None
    last = rows[-1]
    w100 = statistics.median(s.wall for s in last[5])
    c100 = statistics.median(s.wall for s in last[6])
    print(
        f"\n100x the spec costs {w100 / base[0]:.2f}x the time with the cache warm, "
        f"{c100 / base[1]:.2f}x cold "
        f"(linear would be 100x)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
