"""`reconcile lock`: resolve what floats in a spec (package ranges, the model's branch) and write
`specs/<name>.lock`, which `reconcile.spec.pins` reads back.

Called by the CLI's lock command. Package versions come from `pip index versions` against the
spec's own sources (never a wheel download); the model's commit from the hub's API.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import TYPE_CHECKING, Any

from reconcile.errors import ReconcileError
from reconcile.host import CommandTimeout, ToolMissing, atomic_write, run
from reconcile.record import Record
from reconcile.safety.untrusted import load_json
from reconcile.spec.pins import FORMAT, floating_model, floating_packages, lock_path, read_lock

if TYPE_CHECKING:
    from reconcile.spec.loaded import LoadedSpec
    from reconcile.spec.models import Model, Venv


def _redact(url: str) -> str:
    return re.sub(r"(://)[^/@\s]+@", r"\1***@", url)


def index_args(venv: Venv) -> list[str]:
    """Where pip looks, exactly as actions.venv installs: the wheelhouse offline, else the indexes."""
    if venv.wheelhouse is not None:
        return ["--no-index", "--find-links", venv.wheelhouse]
    args = ["--index-url", venv.index_url] if venv.index_url else []
    for url in venv.extra_index_urls:
        args += ["--extra-index-url", url]
    return args


def target_python(venv: Venv) -> str | None:
    """major.minor of the venv's interpreter: wheels are picked for it, not for reconcile's own."""
    from probes.venv import VenvObservation, read_venv

    seen = read_venv(venv.path)
    if isinstance(seen, VenvObservation) and seen.version:
        return ".".join(seen.version.split(".")[:2])
    try:
        done = run([venv.python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], timeout=30)
    except (ToolMissing, CommandTimeout):
        return None
    return done.stdout.strip() if done.ok and re.fullmatch(r"\d+\.\d+", done.stdout.strip()) else None


def available_versions(venv: Venv, name: str, python: str | None) -> list[str]:
    """Every version the spec's index (or wheelhouse) offers, from `pip index versions --pre`: it reads
    only the index page, never downloads a wheel (a vLLM wheel is hundreds of MB)."""
    argv = [
        sys.executable,
        "-m",
        "pip",
        "index",
        "versions",
        name,
        "--pre",
        "--disable-pip-version-check",
        *(["--python-version", python] if python else []),
        *index_args(venv),
    ]
    env = {**os.environ, "PIP_NO_INPUT": "1", "NO_COLOR": "1"}
    try:
        done = run([*argv, "--json"], env=env, timeout=180)
        if not done.ok and "no such option: --json" in done.stderr:  # pip < 23.3
            done = run(argv, env=env, timeout=180)
    except (ToolMissing, CommandTimeout) as exc:
        raise ReconcileError(_redact(f"pip index versions {name}: {exc}")) from None
    if not done.ok:
        tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-2:])
        raise ReconcileError(
            _redact(
                f"pip index versions {name} ({' '.join(index_args(venv)) or 'pip config'}):"
                f" {tail or f'exit {done.returncode}'}"
            )
        )
    text = done.stdout.strip()
    if text.startswith("{"):
        return [str(v) for v in load_json(text).get("versions", [])]
    m = re.search(r"^Available versions: (.*)$", text, re.M)
    if m is None:
        raise ReconcileError(f"pip index versions {name}: unexpected output: {text[:200]}")
    return [v.strip() for v in m.group(1).split(",") if v.strip()]


def best_version(specifier: str, versions: list[str]) -> str | None:
    """The highest version pip would install for `specifier` (pre-releases only when it names one,
    or when nothing else matches: packaging's rule, which pip follows)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    parsed = []
    for v in versions:
        try:
            parsed.append(Version(v))
        except InvalidVersion:
            continue
    matching = list(SpecifierSet("" if specifier.strip() == "*" else specifier).filter(parsed))
    return str(max(matching)) if matching else None


def resolve_model(model: Model) -> str:
    from actions.model import resolve_revision

    assert model.repo is not None
    try:
        return resolve_revision(model.repo, model.revision)
    except ReconcileError:
        raise
    except Exception as exc:  # huggingface_hub's errors carry the hub's answer
        raise ReconcileError(f"{model.repo}@{model.revision}: {type(exc).__name__}: {exc}") from None


class LockResult(Record):
    path: str
    changed: bool  # the lock file was written (absent before, or some pin moved)
    lines: tuple[str, ...]  # one per pin: what floats -> what it is now


def make_lock(loaded: LoadedSpec) -> LockResult:
    """Resolve what floats in `loaded` (the spec as written, without the lock) and write the lock."""
    spec, path = loaded.spec, lock_path(loaded)
    try:
        old = read_lock(path) or {}
    except ReconcileError:
        old = {"damaged": True}  # rewritten below: `reconcile lock` is how a damaged lock is repaired
    floating = floating_packages(spec)
    packages: dict[str, dict[str, Any]] = {}
    lines: list[str] = []
    if floating and spec.venv is not None:
        venv, python = spec.venv, target_python(spec.venv)
        source = (
            [venv.wheelhouse]
            if venv.wheelhouse
            else [_redact(u) for u in ([venv.index_url] if venv.index_url else []) + venv.extra_index_urls]
        )
        for name, specifier in floating.items():
            version = best_version(specifier, available_versions(venv, name, python))
            if version is None:
                raise ReconcileError(
                    f"[venv].packages.{name} = {specifier!r}: no version on "
                    f"{', '.join(source) or 'the configured index'} matches"
                    + (f" for Python {python}" if python else "")
                )
            packages[name] = {"specifier": specifier, "version": version, "from": source}
            was = (old.get("packages") or {}).get(name, {}).get("version")
            lines.append(
                f"{name} {specifier} -> {version}" + (f" (was {was})" if was and was != version else "")
            )
    model: dict[str, Any] | None = None
    if floating_model(spec):
        assert spec.model is not None and spec.model.repo is not None
        commit = resolve_model(spec.model)
        model = {"repo": spec.model.repo, "revision": spec.model.revision, "commit": commit}
        was = (old.get("model") or {}).get("commit")
        lines.append(
            f"model {spec.model.repo}@{spec.model.revision} -> {commit[:12]}"
            + (f" (was {was[:12]})" if was and was != commit else "")
        )
    if not packages and model is None and not old:
        return LockResult(path, False, ())  # nothing floats and no lock to empty: none is needed
    body = {
        "format": FORMAT,
        "spec": os.path.basename(loaded.files[0] if loaded.files else loaded.path),
        "packages": packages,
        "model": model,
    }
    same = {k: old.get(k) for k in body} == body
    if not same:
        body["resolved_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        atomic_write(path, (json.dumps(body, indent=2, sort_keys=True) + "\n").encode(), mode=0o644)
    return LockResult(path, not same, tuple(lines))
