"""Where a spec came from: the commit of its git repository and whether its files differ from it.

Called by the planner (the plan's header and notes) and the executor (each generation records it).
"""

from __future__ import annotations

import os

from reconcile.host import run
from reconcile.record import Record
from reconcile.spec.provenance import spec_file_problem


class GitInfo(Record):
    commit: str | None
    dirty: bool | None  # None: not in a git work tree

    def describe(self) -> str:
        if self.commit is None:
            return "not in git"
        return f"git {self.commit[:12]}" + (" (uncommitted changes)" if self.dirty else "")


def git_info(paths: tuple[str, ...]) -> GitInfo:
    """The commit of the spec's repository and whether the spec files differ from it, asked of git
    each time: one `git status --porcelain=v2 --branch -- paths` (its `# branch.oid` line is the
    commit), bounded by a timeout. Not in a work tree, no commit yet, or no git: (None, None)."""
    if not paths:
        return GitInfo(None, None)
    return GitInfo(*ask_git(paths))


# Nothing of the repository's own configuration may start a program while root asks it for the commit.
SAFE = ("-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null", "-c", "core.untrackedCache=false")


def untrusted_repository(directory: str) -> str | None:
    """Why another user could change what git does in `directory`'s repository (None: only root or
    we can). The repository's configuration chooses programs git runs (core.fsmonitor, a filter's
    clean command, an include): its git directory and config files are held to the spec's own rule
    (sshd's StrictModes by the path-trust layer, and no group or other write on the files)."""
    found = run(
        ["git", *SAFE, "-C", directory, "rev-parse", "--absolute-git-dir", "--git-common-dir"], timeout=5
    )
    if not found.ok:
        return "not in a git work tree"
    lines = found.stdout.splitlines()
    if len(lines) != 2:
        return "git rev-parse gave no git directory"
    gitdir, common = lines[0], os.path.normpath(os.path.join(directory, lines[1]))  # relative to -C
    candidates = [
        gitdir,
        common,
        *(os.path.join(d, f) for d in (gitdir, common) for f in ("config", "config.worktree")),
    ]
    for path in candidates:
        problem = spec_file_problem(path)
        if problem is None and os.path.lexists(path) and os.lstat(path).st_mode & 0o022:
            problem = f"{path} is writable by others (mode {os.lstat(path).st_mode & 0o7777:04o})"
        if problem is not None:
            return problem
    return None


def ask_git(paths: tuple[str, ...]) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the spec files' repository, or (None, None). --no-optional-locks: a status
    run as root never rewrites the repository's index (it would leave it root's)."""
    directory = os.path.dirname(os.path.abspath(paths[0]))
    git = ["git", *SAFE, "-C", directory]
    argv = [*git, "--no-optional-locks", "status", "--porcelain=v2", "--branch", "--ignore-submodules=all"]
    argv += ["--no-ahead-behind", "--", *map(os.path.abspath, paths)]
    try:
        if untrusted_repository(directory) is not None:
            return None, None
        status = run(argv, timeout=5)
        if not status.ok:  # e.g. a base outside the repository: the commit alone, as rev-parse says
            head = run([*git, "rev-parse", "HEAD"], timeout=5)
            return (head.stdout.strip(), False) if head.ok else (None, None)
    except Exception:
        return None, None
    commit = None
    dirty = False
    for line in status.stdout.splitlines():
        if line.startswith("# branch.oid "):
            commit = line[len("# branch.oid ") :].strip()
        elif line and not line.startswith("#"):
            dirty = True
    if commit is None or commit == "(initial)":
        return None, None  # no commit yet: as `git rev-parse HEAD` fails
    return commit, dirty
