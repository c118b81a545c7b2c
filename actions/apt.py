"""Actions for apt: write the spec's repositories as sources files, install the missing packages.

Called by the executor for the `apt` Change (`add_repository` per repository, then one `install`);
the planner calls `apt_knows` to decide whether `install` must refresh the lists first.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from reconcile.errors import ActionError, RetryableError
from reconcile.host import CommandTimeout, Completed, ToolMissing, atomic_write, run
from reconcile.plan.records import ActionResult
from reconcile.safety.filesafety import ensure_dir, open_regular
from reconcile.vllm.apt_policy import policy_table

_KEY_MAX = 1 << 20  # an armored keyring is a few KiB; a sources file one line

if TYPE_CHECKING:
    from reconcile.spec.models import AptRepository

log = logging.getLogger(__name__)

LOCK_BUDGET_S = 120.0  # how long another apt/dpkg may hold the lock before we give up
UPDATE_TIMEOUT_S = 600.0
INSTALL_TIMEOUT_S = 3600.0  # the CUDA dev packages are gigabytes

_LOCK = re.compile(r"Could not get lock|Unable to acquire the dpkg frontend lock|Unable to lock directory")
_HOLDER = re.compile(r"held by process (\d+)(?: \(([^)]*)\))?")
_NOT_FOUND = (
    re.compile(r"^E: Unable to locate package (\S+)", re.M),
    re.compile(r"^E: Version '([^']+)' for '([^']+)' was not found", re.M),
    re.compile(r"^E: Package '([^']+)' has no installation candidate", re.M),
)


def sources_line(repo: AptRepository) -> str:
    """The one-line `deb` entry for `repo` (flat when the suite ends with '/').

    Every field is checked again here, whatever validated the spec: a space, a bracket, a quote, a #
    or a newline in one of them would give apt another option (`trusted=yes`), field or entry.
    """
    from reconcile.spec.values import apt_keyring, apt_uri, apt_word

    try:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", repo.name):
            raise ValueError(f"{repo.name!r} is not a repository name (letters, digits, '.', '_', '-')")
        apt_uri(repo.uri)
        apt_word("an apt suite", repo.suite)
        for component in repo.components:
            apt_word("an apt component", component)
        if repo.keyring is not None:
            apt_keyring(repo.keyring)
    except ValueError as exc:
        raise ActionError(f"[apt].repositories {repo.name[:40]!r}: {exc}") from None
    flat = repo.suite.endswith("/")
    if flat and repo.components:
        raise ActionError(
            f"[apt].repositories {repo.name!r}: suite {repo.suite!r} is a flat repository path "
            "(ends with '/'), which takes no components: remove `components`"
        )
    if not flat and not repo.components:
        raise ActionError(
            f'[apt].repositories {repo.name!r}: suite {repo.suite!r} needs components (e.g. ["main"]), '
            "or end it with '/' for a flat repository"
        )
    options = []
    if repo.keyring is not None:
        options.append(f"signed-by={repo.keyring}")
    if repo.trusted:
        options.append("trusted=yes")
    return " ".join(["deb", f"[{' '.join(options)}]", repo.uri, repo.suite, *repo.components])


def add_repository(repo: AptRepository, sources_dir: str) -> ActionResult:
    """Write `<sources_dir>/reconcile-<name>.list`, copying `key_source` to `keyring` when it is missing."""
    line = sources_line(repo)  # a malformed entry is refused before anything is written
    done: list[str] = []
    if repo.keyring is not None and not os.path.exists(repo.keyring):
        if repo.key_source is None:
            raise ActionError(
                f"[apt].repositories {repo.name!r}: keyring {repo.keyring} does not exist: put the "
                "repository's key there, or set key_source to a local copy of it"
            )
        try:  # through the trust walk: a link only from a directory only root or we can write
            key = open_regular(repo.key_source, max_bytes=_KEY_MAX)
        except OSError as exc:
            raise ActionError(
                f"[apt].repositories {repo.name!r}: cannot read key_source {repo.key_source} "
                f"({exc.strerror}): fix the path or put the key there"
            ) from None
        ensure_dir(os.path.dirname(repo.keyring), 0o755)
        atomic_write(repo.keyring, key, mode=0o644)
        done.append(f"copied {repo.key_source} to {repo.keyring}")

    path = os.path.join(sources_dir, f"reconcile-{repo.name}.list")
    content = f"# Written by reconcile from the spec's [apt].repositories; edits are overwritten.\n{line}\n"
    try:
        current: str | None = open_regular(path, max_bytes=_KEY_MAX, follow=False).decode("utf-8", "replace")
    except FileNotFoundError:
        current = None
    if current != content:
        ensure_dir(sources_dir, 0o755)
        atomic_write(path, content.encode(), mode=0o644)
        done.append(f"{'wrote' if current is None else 'rewrote'} {path}")
    if not done:
        return ActionResult(False, f"{path} already lists {repo.uri} {repo.suite}")
    return ActionResult(True, "; ".join(done))


def _no_tool(tool: str) -> ActionError:
    return ActionError(f"{tool} not found: this machine has no apt/dpkg; remove [apt] from the spec")


def _split(package: str) -> tuple[str, str | None]:
    name, sep, version = package.partition("=")
    return name, (version if sep else None)


def _env() -> dict[str, str]:
    # LC_ALL=C: the messages we parse are English; the rest keeps prompts away on any distro.
    return {**os.environ, "LC_ALL": "C", "DEBIAN_FRONTEND": "noninteractive", "NEEDRESTART_MODE": "a"}


def parse_policy(text: str) -> dict[str, tuple[str | None, tuple[str, ...]]]:
    """`apt-cache policy` output -> {name: (candidate or None, versions)}; the apt probe reads it too."""
    try:
        return policy_table(text)
    except ValueError as exc:
        raise ActionError(str(exc)) from None


def apt_knows(names: Sequence[str]) -> dict[str, bool]:
    """Which packages apt's lists can install: one `apt-cache policy` for all of them.

    A `name=version` entry is known when that version is in apt's version table.
    """
    if not names:
        return {}
    bare = sorted({_split(n)[0] for n in names})
    try:
        out = run(["apt-cache", "policy", *bare], env=_env(), timeout=120)
    except ToolMissing:
        raise _no_tool("apt-cache") from None
    if not out.ok:
        raise ActionError(f"apt-cache policy failed: {_tail(out)}")
    policy = parse_policy(out.stdout)
    known: dict[str, bool] = {}
    for entry in names:
        name, version = _split(entry)
        candidate, versions = policy.get(name, (None, ()))
        known[entry] = candidate is not None if version is None else version in versions
    return known


def _installed(names: Sequence[str]) -> dict[str, str]:
    """{name: installed version} for the packages dpkg says are installed (one dpkg-query)."""
    fmt = "${Package}\t${binary:Package}\t${Version}\t${db:Status-Status}\n"
    try:
        out = run(["dpkg-query", "-W", "-f", fmt, *names], env=_env(), timeout=120)
    except ToolMissing:
        raise _no_tool("dpkg-query") from None
    # rc 1 only means some names are unknown to dpkg; their lines are simply absent.
    if out.returncode not in (0, 1):
        raise ActionError(f"dpkg-query failed: {_tail(out)}")
    found: dict[str, str] = {}
    for line in out.stdout.splitlines():
        parts = line.split("\t")
        if len(parts) != 4:
            raise ActionError(f"cannot parse dpkg-query output line {line!r}")
        package, binary, version, status = parts
        if status == "installed":
            found[package] = found[binary] = version
    return found


def _tail(out: Completed, lines: int = 8) -> str:
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("E:")]
    text = errors or [ln for ln in (out.stderr + out.stdout).splitlines() if ln.strip()][-lines:]
    return "\n".join(text) or f"exit code {out.returncode}"


def _apt_get(argv: Sequence[str], timeout: float) -> Completed:
    try:
        out = run(["apt-get", *argv], env=_env(), timeout=timeout)
    except ToolMissing:
        raise _no_tool("apt-get") from None
    except CommandTimeout as exc:
        raise ActionError(f"{exc}; look for a stuck download or dpkg prompt, then re-run") from None
    if not out.ok and _LOCK.search(out.stderr):
        holder = _HOLDER.search(out.stderr)
        who = f"process {holder.group(1)} ({holder.group(2) or '?'})" if holder else "another process"
        raise RetryableError(f"the apt/dpkg lock is held by {who}")
    return out


def _with_lock_retries(argv: Sequence[str], timeout: float, budget: float) -> Completed:
    from tenacity import (
        RetryError,
        Retrying,
        retry_if_exception_type,
        stop_after_delay,
        wait_exponential,
    )

    retrying = Retrying(
        retry=retry_if_exception_type(RetryableError),
        stop=stop_after_delay(budget),
        wait=wait_exponential(multiplier=0.5, max=5.0),
        before_sleep=lambda state: log.info(
            "apt-get %s: %s; retrying", argv[0], state.outcome.exception() if state.outcome else "?"
        ),
    )
    try:
        out: Completed = retrying(_apt_get, argv, timeout)
    except RetryError as exc:
        why = exc.last_attempt.exception()
        raise ActionError(
            f"apt-get {argv[0]}: {why} for more than {budget:g} s; wait for it to finish "
            "(ps -p <pid>; an unattended upgrade can take minutes) and re-run"
        ) from None
    return out


def _not_found(stderr: str) -> list[str]:
    missing: list[str] = []
    for pattern in _NOT_FOUND:
        for m in pattern.finditer(stderr):
            missing.append(f"{m.group(2)}={m.group(1)}" if m.lastindex == 2 else m.group(1))
    return missing


def _refresh(lock_budget: float) -> str:
    """`apt-get update`; returns what went wrong (to append to a later error), or ""."""
    out = _with_lock_retries(["update"], UPDATE_TIMEOUT_S, lock_budget)
    if out.ok and not re.search(r"^(E|W): Failed to fetch", out.stderr, re.M):
        return ""
    hint = ""
    if "Permission denied" in out.stderr:
        hint = " (apt reads repositories as user _apt: make a file: repository's directory world-readable)"
    log.warning("apt-get update reported errors%s: %s", hint, _tail(out))
    return f"\napt-get update also failed{hint}:\n{_tail(out)}"


def _needed(package: str, installed: dict[str, str]) -> bool:
    name, version = _split(package)
    return name not in installed or (version is not None and installed[name] != version)


def install(packages: Sequence[str], *, update: bool, lock_budget: float = LOCK_BUDGET_S) -> ActionResult:
    """Install the packages dpkg lacks (at their pinned version) with one `apt-get install`.

    `update` refreshes apt's lists first (the planner sets it when sources changed or a package is
    unknown to apt). While another apt/dpkg holds the lock, retries for up to `lock_budget` seconds.
    """
    if not packages:
        return ActionResult(False, "no packages asked for")
    installed = _installed(sorted({_split(p)[0] for p in packages}))
    todo = [p for p in packages if _needed(p, installed)]
    if not todo:
        return ActionResult(False, f"already installed: {', '.join(packages)}")

    # A broken source elsewhere on the machine must not block packages the other sources have:
    # an update failure is only reported when the install then fails too.
    stale = _refresh(lock_budget) if update else ""

    argv = [
        "install",
        "-y",
        "--no-install-recommends",
        "--allow-downgrades",
        "-o",
        "Dpkg::Options::=--force-confdef",
        "-o",
        "Dpkg::Options::=--force-confold",
        *todo,
    ]
    out = _with_lock_retries(argv, INSTALL_TIMEOUT_S, lock_budget)
    if not out.ok:
        missing = _not_found(out.stderr)
        if missing:
            raise ActionError(
                f"apt cannot find {', '.join(missing)}: check the name and version "
                f"(apt-cache policy {' '.join(sorted({_split(m)[0] for m in missing}))}), and add the "
                f"repository that provides it to [apt].repositories{stale}"
            )
        if "without --allow-change-held-packages" in out.stderr:
            raise ActionError(
                f"apt-get install {' '.join(todo)}: a package is on hold; release it "
                f"(apt-mark showhold; apt-mark unhold <name>) or change the spec:\n{_tail(out)}"
            )
        raise ActionError(f"apt-get install {' '.join(todo)} failed:\n{_tail(out)}{stale}")
    summary = re.search(r"^\d+ upgraded, \d+ newly installed.*$", out.stdout, re.M)
    log.info("apt-get install %s: %s", " ".join(todo), summary.group(0) if summary else "done")
    was = [f"{name} {installed[name]} -> {ver}" for name, ver in map(_split, todo) if name in installed]
    new = [p for p in todo if _split(p)[0] not in installed]
    parts = ([f"installed {', '.join(new)}"] if new else []) + ([f"changed {', '.join(was)}"] if was else [])
    return ActionResult(True, "; ".join(parts))
