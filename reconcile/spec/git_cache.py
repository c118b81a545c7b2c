"""The spec's git state (commit, dirty) remembered until a file git reads for it changes.

Called by reconcile.spec.origin.git_info. A converged plan would otherwise start `git rev-parse HEAD` and
`git status --porcelain -- <spec files>` (~8 ms of CPU) on every timer tick. The answer is kept
with where the walk up from the spec's directory found a .git (a new one anywhere on the way moves
it), and the identity (inode, size, mtime, ctime) of everything those two commands read: a
worktree's gitdir file, HEAD, the ref HEAD names and packed-refs, the index, the spec files, every
.gitignore on the way up from each spec file (there or not), info/exclude, the repository's, the
user's and the system's git config and global ignore file, the git binary, and the GIT_* variables; one that
changes what git reads (GIT_DIR, GIT_INDEX_FILE, GIT_CONFIG_*, ...), or a config that includes
another or names its own excludes file: no caching.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable

from reconcile import private_cache
from reconcile.host import which

_FORMAT = 1
# GIT_* variables that change neither which repository git finds nor what status says.
_HARMLESS = (
    "GIT_SSL_", "GIT_AUTHOR_", "GIT_COMMITTER_", "GIT_TERMINAL_PROMPT", "GIT_ASKPASS", "GIT_SSH",
    "GIT_PAGER", "GIT_EDITOR", "GIT_HTTP_", "GIT_CURL_", "GIT_PROXY_", "GIT_LFS_",
)  # fmt: skip
Answer = tuple[str | None, bool | None]


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            return f.read(4096).strip()
    except OSError:
        return None


def _names_other_files(config: str) -> bool:
    """Whether a git config file (there or not) includes another or sets core.excludesFile."""
    try:
        with open(config, encoding="utf-8", errors="surrogateescape") as f:
            text = f.read().lower()
    except OSError:
        return False
    return "excludesfile" in text or "include" in text


def key(paths: tuple[str, ...]) -> tuple[object, ...] | None:
    """What the answer for `paths` depends on; None when that cannot be told without git."""
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("GIT_")))
    if any(not k.startswith(_HARMLESS) for k, _ in env):
        return None  # GIT_DIR, GIT_INDEX_FILE, GIT_CONFIG_*, ...: files this key does not watch
    files = [os.path.abspath(p) for p in paths]
    home = os.path.expanduser("~")
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    configs: tuple[str, ...] = (
        "/etc/gitconfig",
        os.path.join(home, ".gitconfig"),
        os.path.join(xdg, "git", "config"),
    )
    watched = [*files, which("git") or "(no git)", *configs, os.path.join(xdg, "git", "ignore")]
    # Every .gitignore above every spec file (a base may sit in another directory), there or not.
    for other in sorted({os.path.dirname(f) for f in files[1:]} - {os.path.dirname(files[0])}):
        while (parent := os.path.dirname(other)) != other and not os.path.lexists(
            os.path.join(other, ".git")
        ):
            watched.append(os.path.join(other, ".gitignore"))
            other = parent
    directory = os.path.dirname(files[0])
    while True:
        watched.append(os.path.join(directory, ".gitignore"))  # not the dir: its mtime churns (/tmp)
        dotgit = os.path.join(directory, ".git")
        if os.path.lexists(dotgit):
            break
        parent = os.path.dirname(directory)
        if parent == directory:  # not in git; where the walk stops moves when a .git appears
            return (_FORMAT, env, tuple(map(private_cache.stamp, watched)), None, tuple(watched))
        directory = parent
    gitdir = dotgit
    if not os.path.isdir(dotgit):  # a worktree's or submodule's `gitdir: PATH` file
        pointer = _read(dotgit)
        if pointer is None or not pointer.startswith("gitdir: "):
            return None
        gitdir = os.path.join(directory, pointer[len("gitdir: ") :])
    common = gitdir
    if os.path.exists(os.path.join(gitdir, "commondir")):
        named = _read(os.path.join(gitdir, "commondir"))
        if named is None:
            return None
        common = os.path.join(gitdir, named)
    head = _read(os.path.join(gitdir, "HEAD"))
    # Not the .git directory itself: git makes and drops index.lock there on every status. Its
    # parent's mtime tells a new .git; its HEAD's and index's inodes a replaced one.
    watched += [os.path.join(gitdir, "HEAD"), os.path.join(gitdir, "index")]
    if gitdir != dotgit:
        watched.append(dotgit)  # the `gitdir:` file
    watched += [os.path.join(common, "packed-refs"), os.path.join(common, "config")]
    watched += [os.path.join(gitdir, "config.worktree"), os.path.join(common, "info", "exclude")]
    if head is not None and head.startswith("ref: "):
        watched.append(os.path.join(common, head[len("ref: ") :]))
    configs += (os.path.join(common, "config"), os.path.join(gitdir, "config.worktree"))
    if any(map(_names_other_files, configs)):
        return None  # a config that includes another, or names its own excludes file: unwatched files
    return (_FORMAT, env, tuple(map(private_cache.stamp, watched)), head, tuple(watched))


def _entry(files: tuple[str, ...]) -> str:
    joined = "\0".join(os.path.abspath(f) for f in files)
    name = f"{zlib.crc32(joined.encode('utf-8', 'surrogateescape')):08x}-{len(joined)}.marshal"
    return os.path.join(private_cache.cache_root(), "git", name)


def remembered(paths: tuple[str, ...], ask: Callable[[], Answer]) -> Answer:
    """`ask()`'s answer for `paths`, from the cache when nothing it depends on has changed."""
    before = key(paths)
    entry = _entry(paths)
    if before is not None:
        data = private_cache.read(entry)
        if isinstance(data, tuple) and len(data) == 2 and data[0] == before:
            commit, dirty = data[1]
            if (commit is None or isinstance(commit, str)) and dirty in (None, True, False):
                return commit, dirty
    answer = ask()
    # `git status` may refresh the index as it runs: only an answer given while nothing moved is kept.
    if before is not None and key(paths) == before:
        private_cache.write(entry, (before, answer))
    return answer
