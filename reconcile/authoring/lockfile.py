"""`reconcile lock`: resolve what floats in a spec (the venv's whole dependency closure, the model's
branch) and write `specs/<name>.lock`, which `reconcile.spec.pins` reads back.

Called by the CLI's lock command. The closure is uv's resolution (`uv pip compile --format
pylock.toml --generate-hashes`, PEP 751) against the spec's own sources, for the venv's interpreter:
every distribution at one version with the sha256 of each file it may come as, kept as pip's and uv's
hash-checking requirement lines; the model's commit comes from the hub's API.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any

from reconcile.errors import ReconcileError
from reconcile.host import CommandTimeout, ToolMissing, atomic_write, run
from reconcile.record import Record
from reconcile.safety.names import LOCKED
from reconcile.spec.pins import (
    FORMAT,
    closure_request,
    floating_model,
    floating_packages,
    lock_path,
    read_lock,
)

if TYPE_CHECKING:
    from reconcile.spec.loaded import LoadedSpec
    from reconcile.spec.models import Model, Spec, Venv

COMPILE_TIMEOUT_S = 900.0  # a cold resolution of vLLM's closure reads ~150 index pages


def _redact(url: str) -> str:
    return re.sub(r"(://)[^/@\s]+@", r"\1***@", url)


def find_uv() -> str:
    """uv: the operator's on PATH, else the one installed with reconcile (a dependency of it)."""
    found = shutil.which("uv")
    if found is not None:
        return found
    try:
        from uv import find_uv_bin

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        raise ReconcileError(
            "reconcile lock resolves the closure with uv, and there is none: pip install uv"
        ) from None


def _source_args(venv: Venv) -> list[str]:
    """Where uv looks, exactly as actions.venv installs: the wheelhouse offline, else the indexes."""
    from actions.venv_index import index_urls

    if venv.wheelhouse is not None:
        return ["--no-index", "--find-links", venv.wheelhouse]
    index, extra, _ = index_urls(venv)
    args = ["--index-url", index] if index else []
    for url in extra:
        args += ["--extra-index-url", url]
    return args + (["--index-strategy", "unsafe-best-match"] if extra else [])


def _sources(venv: Venv) -> list[str]:
    if venv.wheelhouse:
        return [venv.wheelhouse]
    return [_redact(u) for u in ([venv.index_url] if venv.index_url else []) + venv.extra_index_urls]


def target_interpreter(venv: Venv) -> tuple[str, str, str]:
    """(path, major.minor, platform) of the interpreter the venv is made from: the closure is resolved
    for it (its markers and wheel tags), not for reconcile's own."""
    from actions.venv import ISOLATED, trusted_python

    # root runs it (and uv does, with --python): held to the exec role, as apply holds it (an
    # ActionError, a ReconcileError, naming the directory and the fix)
    found = trusted_python(venv, missing_ok=True)
    probe = "import sys, sysconfig; print('%d.%d' % sys.version_info[:2], sysconfig.get_platform())"
    try:
        done = run([found, *ISOLATED, "-c", probe], timeout=30) if found else None
    except (ToolMissing, CommandTimeout):
        done = None
    words = done.stdout.split() if done is not None and done.ok else []
    if found is None or len(words) != 2 or not re.fullmatch(r"\d+\.\d+", words[0]):
        raise ReconcileError(
            f"[venv].python = {venv.python!r} does not run here: the closure is locked for the venv's "
            "interpreter, so run `reconcile lock` where it is installed (the target machine, or one like it)"
        )
    return os.path.realpath(found), words[0], words[1]


def parse_pylock(text: str) -> list[str]:
    """uv's PEP 751 `pylock.toml` answer as one `name==version --hash=sha256:...` line per
    distribution: the sha256 of every wheel it lists for that version. Not the sdist's: the install
    is hash-checked, so with no sdist hash pip or uv can never take (and build, as root) the sdist."""
    if sys.version_info >= (3, 11):
        import tomllib

        doc: dict[str, Any] = tomllib.loads(text)
    else:  # 3.10: the spec's own TOML parser
        import tomlkit

        doc = tomlkit.parse(text).unwrap()
    entries = []
    for package in doc.get("packages") or []:
        files = list(package.get("wheels") or [])
        hashes = sorted(
            {f"--hash=sha256:{f['hashes']['sha256']}" for f in files if "sha256" in f.get("hashes", {})}
        )
        entry = " ".join([f"{_norm(str(package.get('name')))}=={package.get('version')}", *hashes])
        if not package.get("version") or not re.fullmatch(LOCKED, entry):
            raise ReconcileError(
                f"uv's resolution has {package.get('name')} {package.get('version') or '(no version)'} "
                "without wheels with sha256 hashes: a direct URL, a directory, an sdist or a source without "
                "hashes cannot be locked (an sdist's build would run its code as root)"
            )
        entries.append(entry)
    return sorted(entries)


def compile_closure(venv: Venv, python: str) -> list[str]:
    """The closure of the spec's packages, resolved by uv for interpreter `python` (no wheel installed,
    wheels are read only as far as uv needs their metadata and hashes)."""
    from actions.venv_index import index_urls, netrc_env

    uv = find_uv()
    with tempfile.TemporaryDirectory(prefix="reconcile-lock-") as tmp:
        wanted = os.path.join(tmp, "requirements.in")
        text = "".join(f"{n}{'' if s == '*' else s}\n" for n, s in venv.packages.items())
        atomic_write(wanted, text.encode(), mode=0o600)
        argv = [
            uv, "pip", "compile", wanted, "--format", "pylock.toml", "--generate-hashes",
            "--python", python, "--no-header", "--no-progress", "--color", "never",
            "--refresh",  # what the sources offer today, not uv's cached index pages (revalidated)
            # Wheels only: uv builds an sdist to learn its metadata, running its build backend (the
            # index's or wheelhouse's code) as root, before anyone has looked at what was resolved.
            "--no-build",
            *(["--no-deps"] if venv.no_deps else []), *_source_args(venv),
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        with netrc_env(index_urls(venv)[2] if venv.wheelhouse is None else []) as netrc:
            try:
                done = run(argv, env={**env, **netrc, "NO_COLOR": "1"}, timeout=COMPILE_TIMEOUT_S)
            except (ToolMissing, CommandTimeout) as exc:
                raise ReconcileError(_redact(f"uv pip compile: {exc}")) from None
    if not done.ok:
        lines = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()]
        text = " ".join(lines[-4:]) or f"exit {done.returncode}"
        if "building from source is disabled" in text or "--no-build" in text:
            text += (
                " (reconcile lock resolves wheels only: building an sdist runs its build backend as "
                "root; put a wheel of it in the wheelhouse or the index)"
            )
        raise ReconcileError(
            _redact(
                f"uv pip compile ({', '.join(_sources(venv)) or 'the configured index'}) found no "
                f"closure for {', '.join(f'{n}{s}' for n, s in venv.packages.items())}: " + text
            )
        )
    return parse_pylock(done.stdout)


def _versions(lines: list[str]) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in (re.fullmatch(LOCKED, ln) for ln in lines) if m}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


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


def _closure_lines(old: list[str], new: list[str]) -> list[str]:
    """What moved in the closure: `name 1.0 -> 1.1`, `+ name 2.0`, `- name 1.0`, or a hash changed."""
    was, now = _versions(old), _versions(new)
    moved = [f"  {n} {was[n]} -> {now[n]}" for n in sorted(set(was) & set(now)) if was[n] != now[n]]
    moved += [f"  + {n} {now[n]}" for n in sorted(set(now) - set(was))]
    moved += [f"  - {n} {was[n]}" for n in sorted(set(was) - set(now))]
    same_version = {ln.split(" ", 1)[0] for ln in old} & {ln.split(" ", 1)[0] for ln in new}
    rehashed = sorted({ln.split(" ", 1)[0] for ln in set(new) - set(old)} & same_version)
    moved += [f"  {pin}: other file hashes" for pin in rehashed]
    return moved


def _venv_paths_trusted(spec: Spec) -> None:
    """The path rule plan and apply hold the venv's paths to (reconcile.preflight.paths), before root
    runs its interpreter or hands uv its wheelhouse: uv builds an sdist it finds there to read its
    metadata, running the sdist's build backend as root. `reconcile lock` runs no preflight."""
    from reconcile.preflight.paths import path_findings

    for finding in path_findings(spec):
        key = finding.evidence.get("key", "")
        if finding.severity == "error" and str(key).startswith("[venv]"):
            raise ReconcileError(f"{finding.message}; {finding.fix}")


def make_lock(loaded: LoadedSpec) -> LockResult:
    """Resolve what floats in `loaded` (the spec as written, without the lock) and write the lock."""
    spec, path = loaded.spec, lock_path(loaded)
    if (loaded.resolved.get("venv") or {}).get("closure"):
        raise ReconcileError(
            f"{loaded.files[0] if loaded.files else loaded.path}: [venv].closure is written by "
            f"`reconcile lock` into {os.path.basename(path)}, not in a spec: remove it"
        )
    try:
        old = read_lock(path) or {}
    except ReconcileError:
        old = {"damaged": True}  # rewritten below: `reconcile lock` is how a damaged lock is repaired
    packages: dict[str, dict[str, Any]] = {}
    closure: dict[str, Any] | None = None
    lines: list[str] = []
    resolver = None
    if spec.venv is not None and spec.venv.packages:
        venv = spec.venv
        _venv_paths_trusted(spec)
        interpreter, python, platform = target_interpreter(venv)
        started = time.monotonic()
        requirements = compile_closure(venv, interpreter)
        took = time.monotonic() - started
        versions = _versions(requirements)
        closure = {
            "for": closure_request(venv),
            "python": python,
            "platform": platform,
            "from": _sources(venv),
            "requirements": requirements,
        }
        for name, specifier in floating_packages(spec).items():
            version = versions.get(_norm(name))
            if version is None:  # uv resolved it, so only a name uv spells otherwise
                raise ReconcileError(
                    f"[venv].packages.{name}: not in uv's resolution; name it as the index does"
                )
            packages[name] = {"specifier": specifier, "version": version, "from": _sources(venv)}
            was = (old.get("packages") or {}).get(name, {}).get("version")
            lines.append(
                f"{name} {specifier} -> {version}" + (f" (was {was})" if was and was != version else "")
            )
        old_closure = (old.get("closure") or {}).get("requirements") or []
        lines.append(
            f"closure: {len(requirements)} distributions with sha256 hashes for Python {python} {platform} "
            f"(uv, {took:.1f} s)"
        )
        if old_closure:
            lines += _closure_lines(old_closure, requirements)
        resolver = uv_version()
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
    if not packages and closure is None and model is None and not old:
        return LockResult(path, False, ())  # nothing floats and no lock to empty: none is needed
    body = {
        "format": FORMAT,
        "spec": os.path.basename(loaded.files[0] if loaded.files else loaded.path),
        "packages": packages,
        "closure": closure,
        "model": model,
    }
    same = {k: old.get(k) for k in body} == body
    if not same:
        body["resolved_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        body["resolver"] = resolver
        atomic_write(path, (json.dumps(body, indent=2, sort_keys=True) + "\n").encode(), mode=0o644)
    return LockResult(path, not same, tuple(lines))


def uv_version() -> str | None:
    try:
        done = run([find_uv(), "--version"], timeout=30)
    except (ToolMissing, CommandTimeout, ReconcileError):
        return None
    return done.stdout.strip() or None if done.ok else None
