"""Issue 24's hostile reader, seventeenth round (part B): attacks on what rounds 15 and 16 added and no
round had attacked (the `#!` line's words, the value role's whole pieces, the port's leading zeros, the
trust-remote-code rule's reading of the flag), and the two things round 16 left open (the API key
replaced by a hard link, the rollback's restart reason), found by reading docs/security.md and the code
alone, each run for real, each seen succeeding on main before its fix unless its docstring says it was
already refused.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from reconcile.errors import ActionError
from tests.apply_support import Demo
from tests.ownership_support import NOBODY, NOGROUP, listening_as_nobody
from tests.test_hostile_reader import nobody_runs
from tests.test_hostile_reader9 import refused_as_server
from tests.test_hostile_reader13 import ROOT_ONLY
from tests.test_hostile_reader14 import top_level
from tests.test_hostile_reader15 import SERVE_BODY, plant_pycache
from tests.test_untrusted_trees import Tree, tree

__all__ = ["top_level", "tree"]  # the fixtures, from the fourteenth round and test_untrusted_trees

NEEDS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (files of another user)")

# --- class 1: a `#!` line's argument is the one the kernel hands --------------------------------------

BINPRM_BUF = 256  # how much of a script the kernel reads for its `#!` line (BINPRM_BUF_SIZE)


def _shebang(prefix: bytes, how: str) -> bytes:
    """Root's server script whose `#!` line hands python `-Xpycache_prefix=<prefix>`, as the kernel
    reads it: `prefix` then a newline (`newline`), or (`past-255`) one more byte `Z` at offset 255 and no
    newline in the first 256 bytes, where the kernel ends the argument at offset 254 (binfmt_script.c:
    `i_end = buf + sizeof(buf) - 1`)."""
    line = b"#!" + os.fsencode(sys.executable) + b" -Xpycache_prefix=" + prefix
    if how == "newline":
        return line + b"\n" + SERVE_BODY
    assert len(line) == BINPRM_BUF - 1, len(line)
    return line + b"Z and more of a comment\n" + SERVE_BODY


@NEEDS_ROOT
@pytest.mark.parametrize("how", ["space", "tab", "past-255"])
def test_a_shebang_argument_is_judged_as_the_one_argument_the_kernel_hands(
    demo: Demo, outside: Path, top_level: Path, how: str
) -> None:
    """Round 15 split a `#!` line's argument into words at a space or a tab "as the kernel and env -S
    split", and judged each word. But the kernel does not split it: it hands the interpreter the whole
    rest of the line as one argument (binfmt_script.c; only env -S splits). `#!python
    -Xpycache_prefix=/<top>/ok -pyc` makes python's pycache prefix the directory `/<top>/ok -pyc`
    (seen: sys.pycache_prefix), here nobody's, beside root's empty `/<top>/ok`; the rule judged
    `/<top>/ok` and the option `-pyc`. And with no newline in the first 256 bytes the kernel ends the
    argument at offset 254, where the rule read 256 bytes: it judged `/<top>/ok...aZ` (missing, under
    root's `/<top>`), python read nobody's `/<top>/ok...a`. main (seen): planned clean; root's server
    ran nobody's bytecode (it recorded uid 0)."""
    marker = outside / "ran-as"
    (top_level / "ok").mkdir()  # root's, empty
    head = os.fsencode(top_level) + b"/ok"
    if how == "past-255":
        fill = BINPRM_BUF - 1 - len(b"#!" + os.fsencode(sys.executable) + b" -Xpycache_prefix=" + head)
        prefix = head + b"a" * fill
    else:
        prefix = head + (b" " if how == "space" else b"\t") + b"-pyc"
    plant_pycache(outside, prefix, marker)
    server = outside / "serve"
    server.write_bytes(_shebang(prefix, "past-255" if how == "past-255" else "newline"))
    server.chmod(0o755)
    refused_as_server(demo, server, marker, "[server].executable", "-Xpycache_prefix=")


# --- class 1: a server's value is judged whole, as the program that reads it whole -------------------


@NEEDS_ROOT
@pytest.mark.parametrize("tail", ["ok:pyc", "okfile:/pyc", "ok_a://pyc"], ids=["colon", "file-url", "url"])
def test_a_servers_value_read_whole_is_judged_whole(
    demo: Demo, outside: Path, top_level: Path, tail: str
) -> None:
    """The value role judges a value word by word, and (round 15) by its pieces between `:=,;` quotes
    and brackets, and between `:` alone; and first blanks out whatever looks like a URL (`file:` before
    a `/`, `scheme://...`), wherever in a word it starts. python reads PYTHONPYCACHEPREFIX whole:
    `/<top>/ok:pyc` is one directory, here nobody's, beside root's empty `/<top>/ok` (judged as
    `/<top>/ok` and `pyc`, which names nothing); `/<top>/okfile:/pyc` was judged as `/<top>/ok /pyc`
    and its words (the `file:` blanked out), `/<top>/ok_a://pyc` as `/<top>/ok_` (`a://pyc` read as a
    URL), none of them there, while python read nobody's `/<top>/okfile:/pyc` and `/<top>/ok_a:/pyc`
    (their parents root's). main (seen): planned clean; root's server (root's script, importing root's
    module) ran nobody's bytecode (uid 0)."""
    marker = outside / "ran-as"
    (top_level / "ok").mkdir()
    prefix = os.path.normpath(f"{top_level}/{tail}")
    os.makedirs(os.path.dirname(prefix), exist_ok=True)  # root's
    plant_pycache(outside, os.fsencode(prefix), marker)
    server = outside / "serve"
    server.write_bytes(b"#!" + os.fsencode(sys.executable) + b"\n" + SERVE_BODY)
    server.chmod(0o755)

    def edit(doc: Any) -> None:
        doc["server"].setdefault("env", {})["PYTHONPYCACHEPREFIX"] = f"{top_level}/{tail}"

    refused_as_server(demo, server, marker, "PYTHONPYCACHEPREFIX", edit_more=edit)


# --- class 4: a port as httpx reads it ------------------------------------------------------------------


def _arabic(digits: str) -> str:
    return "".join(chr(0x660 + int(d)) for d in digits)


# (variable, value with PORT) -> the port as written; each seen carrying root's hub traffic to nobody's
# listener on PORT: huggingface_hub 2.4 (httpx2) with the variable set sent `CONNECT huggingface.co:443`
# there (run: a listener of nobody's recording the first bytes).
PORT_FORMS = {
    "underscore": lambda p: f"http://127.0.0.1:{p[0]}_{p[1:]}",
    "plus": lambda p: f"http://127.0.0.1:+{p}",
    "blank": lambda p: f"http://127.0.0.1: {p}",
    "arabic-indic": lambda p: f"http://127.0.0.1:{_arabic(p)}",
    "bare-underscore": lambda p: f"127.0.0.1:{p[0]}_{p[1:]}",
}


@ROOT_ONLY
@pytest.mark.parametrize("form", list(PORT_FORMS))
def test_a_port_is_read_as_httpx_reads_it(demo: Demo, strangers: list[int], form: str) -> None:
    """The listener rule reads a URL's port as ASCII digits (their leading zeros skipped: round 15), else
    as the scheme's default port; the bare host:port as 1-5 digits. huggingface_hub's httpx2 reads a
    port with Python's int(): `1_2345`, `+12345`, ` 12345` and `١٢٣٤٥` (Arabic-Indic digits) are all port
    12345 to it, and a proxy written bare is read as `http://` + it. main (seen): `https_proxy` kept (no
    line), the rule read port 80 (or 1 for the bare form), below 1024; root's hub client sent its
    traffic to nobody's listener."""
    port = listening_as_nobody(strangers)
    value = PORT_FORMS[form](str(port))
    run = demo.cli("plan", env={"https_proxy": value})
    assert "reconcile: environment https_proxy left out: " in run.output, run.output
    assert f"port {port} on " in run.output and "listened on by nobody (uid 65534)" in run.output, run.output
    assert "Traceback" not in run.output, run.output


# --- class 2: the trust-remote-code rule, on the model the server is handed ------------------------


def test_remote_code_from_a_local_model_the_server_is_handed_holds_it_to_the_read_role(tree: Tree) -> None:
    """The trust-remote-code rule holds `[model] source` to the read role, whole tree. But `[server]
    model` (what `vllm serve` is given, default `[model] dir`) may name a local directory itself, which
    the server reads in place: with trust-remote-code vLLM imports its modeling_*.py as the server's
    user, root by default. Here `[server] model` is nobody's tree with a modeling_x.py, and no `[model]`
    section. main (seen): planned clean (`[server] model` has no role at all)."""
    nobody_runs(f"printf 'import os\\nos.system(\"id > /tmp/x\")\\n' > {tree.source}/modeling_x.py")
    tree.spec.write_text(
        f'[machine]\nstate_dir = "{tree.root}/state"\n'
        f'[server]\nname = "m"\nexecutable = "/bin/true"\nlog = "{tree.root / "m.log"}"\n'
        f'model = "{tree.source}"\nargs = {{ trust-remote-code = true }}\n'
    )
    plan = tree.cli("plan")
    assert "Traceback" not in plan.output, plan.output
    assert plan.returncode == 1, plan.output
    assert "[server].model" in plan.output and "trust-remote-code" in plan.output, plan.output
    assert str(tree.source) in plan.output and "owned by nobody" in plan.output, plan.output


# --- class 1: the API key's directory owner, and a hard link ------------------------------------------


@NEEDS_ROOT
def test_a_key_replaced_by_a_hard_link_never_gets_root_to_chown_the_other_file(outside: Path) -> None:
    """The key's owner may own the key's directory (the path rule allows it). Round 16 left open: they
    replace the key by a hard link to another file, and root's fchmod/fchown of the key lands on that
    file. With fs.protected_hardlinks = 1 (this machine's) they may link a file they own or can read and
    write: here a root file of mode 0666 beside their directory. main (seen): root chowned that file to
    nobody:nogroup and set it 0600. Now a key with more than one name is refused, naming the fix."""
    from actions.api_key import ensure_key
    from reconcile.spec.models import ApiKey

    keys = outside / "keys"
    keys.mkdir(mode=0o700)
    os.chown(keys, NOBODY, NOGROUP)
    victim = outside / "roots-file"
    victim.write_text("root's\n")
    victim.chmod(0o666)
    nobody_runs(f"ln {victim} {keys}/api.key")
    with pytest.raises(ActionError) as refused:
        ensure_key(ApiKey(file=str(keys / "api.key"), owner="nobody"))
    st = victim.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (0, 0, 0o666)
    assert str(keys / "api.key") in str(refused.value) and "hard link" in str(refused.value), refused.value


# --- class 5: the restart reason names the variable that changed -------------------------------------


def test_a_rollbacks_restart_reason_names_the_secret_that_changed(seeded: Demo) -> None:
    """Round 15 left open: rolling back with `https_proxy` (a secret by its content, a URL's password)
    changed, the restart reason read `env changed: one of VLLM_API_KEY (sensitive) changed`. Already
    right on main (787187d hashed such a value on its own; this test passed there): kept as the member
    that runs it through the CLI's rollback, two applies and a third password, as round 15 did. It names
    https_proxy, and no password."""

    def proxy(password: str) -> Any:
        def edit(doc: Any) -> None:
            doc["server"].setdefault("env", {})["https_proxy"] = f"http://u:{password}@proxy.invalid:3128"

        return edit

    for password in ("pw17-first", "pw17-second"):
        seeded.write_spec(proxy(password))
        assert seeded.cli("apply", timeout=300).returncode == 2
    seeded.write_spec(proxy("pw17-third"))
    back = seeded.cli("rollback", "1", timeout=300)
    assert "Traceback" not in back.output, back.output
    assert "https_proxy (sensitive) changed" in back.output, back.output
    assert "VLLM_API_KEY" not in back.output, back.output
    assert "pw17" not in back.output, back.output


def test_a_restart_reason_against_an_older_record_names_the_secret_that_changed() -> None:
    """Why round 15 saw the wrong name: the reason names a secret that changed by its own hash in both
    records, and else falls back to `one of <env.secrets>`, the secret *names* only. A record written
    before 787187d (a server started by an older reconcile, still running after the upgrade) has no hash
    for `https_proxy`: a new proxy password then read `env changed: one of VLLM_API_KEY (sensitive)
    changed` (seen on main, this test), naming a variable that did not change. Now a variable shown
    alike in both whose hash is in either record and differs is named."""
    from reconcile.identity import explain_change, launch_identity

    def components(password: str) -> dict[str, str]:
        env = {"VLLM_API_KEY": "k" * 40, "https_proxy": f"http://u:{password}@proxy:3128"}
        made = launch_identity(["vllm", "serve", "m"], env, {"VLLM_API_KEY"}, {"vllm": "0.9.0"}, None, None)
        return dict(made.components)

    old = components("pw17-first")
    hashes = json.loads(old["env.secret_hashes"])
    del hashes["https_proxy"]  # as a record written before 787187d has it
    old["env.secret_hashes"] = json.dumps(hashes)
    reason = explain_change(old, components("pw17-second"))
    assert reason == "env changed: https_proxy (sensitive) changed", reason


# --- class 1: an unsigned apt repository, by every scheme apt reads a local path with ---------------


@NEEDS_ROOT
@pytest.mark.parametrize("scheme", ["copy://", "copy:"])
def test_an_unsigned_apt_repository_by_the_copy_method_is_judged_as_a_local_index(
    tmp_path: Path, scheme: str
) -> None:
    """Round 16 held a trusted (unsigned) repository's `file:` uri to the index role. apt reads a local
    directory by another method too: `copy:` (its packages copied into the cache instead of used in
    place). `copy:///<dir>` named no path to the rule (a `scheme://` URL is blanked out as remote), so a
    repository of nobody's planned clean; seen: apt-get update with `deb [trusted=yes]
    copy:///<nobody's dir> ./` fetched nobody's Packages, and apt-cache policy offered its package. main
    (seen): no finding for `copy:///`; `copy:/<dir>` (one slash) was already judged (kept: the same
    method)."""
    from tests.test_hostile_reader16 import _errors, _unsigned_repo_spec
    from tests.test_path_trust import nobodys_dir

    repo = nobodys_dir(tmp_path / "theirs") / "repo"
    repo.mkdir()
    os.chown(repo, NOBODY, NOGROUP)
    found = _errors(tmp_path, _unsigned_repo_spec(tmp_path, f"{scheme}{repo}"))
    assert any(e.startswith("[apt].repositories") and "owned by nobody" in e for e in found), found
