"""Issue 24: the file-system calls that act on a path by name (open, chmod, chown, unlink, rename,
mkdir, rmtree, copy, exec, listdir, ...) belong in the trust layer (reconcile/safety/), which walks a
path from / by descriptor. Everywhere else such a call must be accounted for here, module by module,
with the reason it is safe; the count may only go down. A new call in an unlisted module, or one more
in a listed one, fails this test: route it through reconcile.safety.filesafety (walk, open_regular,
open_dir, ensure_dir, open_nofollow, resolve_exec) or add it here with its reason, for review.
"""

from __future__ import annotations

import ast
import collections
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CALLS = {
    "open", "os.open", "os.chmod", "os.chown", "os.lchown", "os.unlink", "os.remove", "os.rename",
    "os.replace", "os.rmdir", "os.makedirs", "os.mkdir", "os.symlink", "os.link", "os.truncate",
    "os.utime", "os.listdir", "os.scandir", "os.walk", "os.execv", "os.execve", "os.execvp",
    "os.execvpe", "shutil.rmtree", "shutil.copy", "shutil.copy2", "shutil.copyfile", "shutil.copystat",
    "shutil.copymode", "shutil.copytree", "shutil.move", "tempfile.mkstemp",
}  # fmt: skip
TRUST_LAYER = ("reconcile/safety/",)

PROC = "the kernel's own records under /proc, /sys or the cgroup fs: no user can plant a name there"
OURS = "files shipped inside reconcile's own package (data tables), not a path the spec names"
STATE = "under the state dir or the per-user cache, whose directory ensure_dir walked and made 0700"
SEAM = "the host seam's atomic writer and temp sweep: called with directories walked by the caller"
SPEC = "the spec's own files, read by the loader (issue 24 class 3: their provenance check)"
BELOW = (
    "below a directory the path rule walked (model dir, venv, store, state dir, pidfile's): every "
    "directory on the way is root's or ours, so no other user can change a name there"
)
SYSTEM = "the system's own root-only files (/etc/apt, dpkg's admindir, /etc/systemd/system)"
TEMP = "a private temp directory reconcile made itself (mkdtemp, 0700)"
DATA_TREE = "a [model] source tree: data from outside, read by the source-tree rules (class 2)"

ALLOWED: dict[str, tuple[int, str]] = {
    "actions/api_key.py": (3, BELOW),
    "actions/cgroups.py": (5, PROC),
    "actions/launching.py": (
        4,
        BELOW + "; prepare_socket makes, opens (O_NOFOLLOW) and empties a color's socket directory by "
        "names relative to a descriptor of root's /run/reconcile (0711, walked by ensure_dir and open_dir)",
    ),
    "actions/model.py": (
        4,
        BELOW + "; the store's hub blobs linked into a realization by its directory's fd",
    ),
    "actions/model_config.py": (4, BELOW),
    "actions/model_copying.py": (4, DATA_TREE),
    "actions/model_resuming.py": (5, BELOW),
    "actions/server.py": (1, BELOW),
    "actions/supervising.py": (4, PROC),
    "actions/systemd_unit.py": (1, SYSTEM),
    "actions/venv.py": (
        8,
        BELOW + "; library_problem lists, and dlopen_problem walks, a standard library the read role "
        "judged first; _getpath_files lists the program's, its home's and each prefix's `lib` directory "
        "for the `._pth` and `pybuilddir.txt` getpath reads there, each held to the read role",
    ),
    "actions/venv_index.py": (1, TEMP),
    "probes/apt.py": (2, SYSTEM),
    "probes/gpu.py": (1, PROC),
    "probes/hub.py": (4, STATE),
    "probes/venv.py": (2, BELOW),
    "reconcile/apply/benchmark.py": (1, TEMP),  # rmtree of the mkdtemp where vllm bench serve writes
    "reconcile/apply/generations.py": (1, STATE),
    "reconcile/apply/journal.py": (1, STATE),
    "reconcile/apply/model_store.py": (6, BELOW + "; each by a descriptor from filesafety.open_dir"),
    "reconcile/apply/store.py": (8, BELOW),
    "reconcile/authoring/init_survey.py": (2, PROC),
    "reconcile/host.py": (11, SEAM),
    "reconcile/ownership/cgroups.py": (3, PROC),
    "reconcile/ownership/membership.py": (2, PROC),
    "reconcile/ownership/sockets.py": (2, PROC),
    "reconcile/preflight/features.py": (1, OURS),
    "reconcile/private_cache.py": (6, STATE),
    "reconcile/spec/provenance.py": (1, SPEC),
    "reconcile/unattended/pause.py": (1, STATE),
    "reconcile/unattended/timer.py": (2, SYSTEM),
    "reconcile/vllm/architectures.py": (1, OURS),
    "reconcile/vllm/attention.py": (1, BELOW),
    "reconcile/vllm/catalogue.py": (1, OURS),
    "reconcile/vllm/families.py": (1, OURS),
    "reconcile/vllm/flags.py": (1, OURS),
}


def _name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return f"{func.value.id}.{func.attr}"
    return None


def direct_calls() -> dict[str, int]:
    found: collections.Counter[str] = collections.Counter()
    for top in ("reconcile", "probes", "actions"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(TRUST_LAYER):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and _name(node.func) in CALLS:
                    found[rel] += 1
    return dict(found)


def test_no_module_acts_on_a_path_by_name_beyond_what_is_accounted_for() -> None:
    found = direct_calls()
    over = {m: (n, ALLOWED.get(m, (0, ""))[0]) for m, n in found.items() if n > ALLOWED.get(m, (0, ""))[0]}
    assert not over, (
        "direct file-system calls outside reconcile/safety/ (module: found, allowed): "
        f"{over}; use reconcile.safety.filesafety, or account for them in ALLOWED with the reason"
    )


def test_the_accounts_shrink_with_the_code() -> None:
    """A count above what the module now has must come down, so the list cannot hide new calls."""
    found = direct_calls()
    stale = {m: (found.get(m, 0), n) for m, (n, _) in ALLOWED.items() if found.get(m, 0) < n}
    assert not stale, f"lower these counts in ALLOWED (module: found, listed): {stale}"
