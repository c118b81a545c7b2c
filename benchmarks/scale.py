"""How `reconcile plan` grows with the spec: 1x, 10x and 100x, 100x being 300 apt packages, 500 venv packages
and 50 config.json keys (1x: 3, 5 and 1).

Run: python3 benchmarks/scale.py [--rounds 10]
Every spec is converged, so what grows is the probes' and planners' work, not the drift rendering: its apt
packages are ones dpkg says are installed here; its venv is a real `python -m venv --without-pip` holding
one fake `*.dist-info/METADATA` per package (the venv probe reads METADATA only, never runs pip); its model
dir and config patch are made by one real `reconcile apply` before timing. Times are of the console script
of benchmarks/.venvs/reconcile (a new process per run), spec cache warm and cold, all six cases and the
floor (`python -c pass`) interleaved in one loop, so 100x / 1x compares runs of the same rounds.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchenv import clean_env, machine, reconcile_venv
from interleave import Case, floor_case, interleave, loadavg

# scale -> (apt packages, venv packages, config.json keys in the patch)
SIZES = {1: (3, 5, 1), 10: (30, 50, 5), 100: (300, 500, 50)}
TARGET_100X = 1.2  # warm 100x / warm 1x (issue 18)


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", "--runs", type=int, default=10)
    args = parser.parse_args()
    reconcile = reconcile_venv()
    available = installed_packages()
    sizes = []
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
            sizes.append((scale, n_apt, n_venv, n_keys, spec, os.path.getsize(spec)))
        homes = Path(tmp) / "homes"
        homes.mkdir()
        cases = []
        for kind in ("warm", "cold"):
            for scale, *_, spec, _ in sizes:
                argv = [str(reconcile), "plan", "--spec", str(spec)]
                env = warm_env(homes / f"x{scale}") if kind == "warm" else cold_env(homes)
                cases.append(Case(f"{scale}x {kind}", argv, env, Path(tmp), (0,)))
        before = loadavg()
        floor = floor_case(str(reconcile.parent / "python"), clean_env(), Path(tmp))
        results = {r.label: r for r in interleave(floor, cases, args.rounds)}
    print(f"machine: {machine()}\ndate: {time.strftime('%Y-%m-%d %H:%M %Z')}")
    print(f"load average before: {before}; after: {loadavg()}\n")
    print(
        f"`reconcile plan` of a converged generated spec, {args.rounds} rounds of: the floor, then every "
        "case once (ms; × floor: median over rounds of case / that round's floor)\n"
    )
    print(
        "| size | apt pkgs | venv pkgs | config keys | spec bytes | warm wall | warm CPU | warm × floor "
        "| cold wall | cold CPU | cold × floor |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for scale, n_apt, n_venv, n_keys, _, size in sizes:
        w, c = results[f"{scale}x warm"], results[f"{scale}x cold"]
        print(
            f"| {scale}x | {n_apt} | {n_venv} | {n_keys} | {size:,} | {w.wall * 1000:.0f} "
            f"| {w.cpu * 1000:.0f} | {w.ratio:.1f} | {c.wall * 1000:.0f} | {c.cpu * 1000:.0f} "
            f"| {c.ratio:.1f} |"
        )
    top = max(SIZES)
    warm, cold = results[f"{top}x warm"], results[f"{top}x cold"]
    one_warm, one_cold = results["1x warm"], results["1x cold"]
    met = "met" if warm.versus(one_warm) <= TARGET_100X else "MISSED"
    print(
        f"\n{top}x the spec costs {warm.versus(one_warm):.2f}x the wall time of 1x with the cache warm "
        f"({warm.versus_cpu(one_warm):.2f}x the CPU time; target <= {TARGET_100X}: {met}), "
        f"{cold.versus(one_cold):.2f}x cold ({cold.versus_cpu(one_cold):.2f}x CPU): medians over rounds of "
        f"{top}x / 1x of the same round; linear would be {top}x."
    )
    return 0


def warm_env(home: Path) -> Callable[[], dict[str, str]]:
    env = clean_env(XDG_CACHE_HOME=str(home))
    return lambda: env  # the warm-up round fills it


def cold_env(homes: Path) -> Callable[[], dict[str, str]]:
    return lambda: clean_env(XDG_CACHE_HOME=tempfile.mkdtemp(prefix="cold-", dir=homes))


if __name__ == "__main__":
    sys.exit(main())
