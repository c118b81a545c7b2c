"""reconcile/safety/display.py: outside strings made safe to show, and the CLI's one chokepoint for
everything it prints (SafeStream). The attacks themselves run in tests/test_network_attacks.py."""

from __future__ import annotations

import ast
import io
import json
import random
import re
from pathlib import Path

import pytest

from reconcile import cli
from reconcile.plan.render import _REPORT_SYMBOL, _SYMBOL_COLOUR, _VERDICT, _Painter, paint_report
from reconcile.safety.display import OWN_SEQUENCE, SafeStream, for_stream, shown

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = "v\x1b]0;pwned\x07\x1b[2J\x1b[5;5H\x1b[8m\x9b31m\u2028\u2029\x7f\x00\r\n\tend"
# What may reach a terminal: printable text, newline, tab and reconcile's own sequences.
LEFT = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def test_shown_escapes_every_control_character_visibly() -> None:
    assert shown(HOSTILE) == (
        "v\\u001b]0;pwned\\u0007\\u001b[2J\\u001b[5;5H\\u001b[8m\\u009b31m\\u2028\\u2029\\u007f\\u0000\\r\\n\\tend"
    )
    assert shown("plain ✓ text") == "plain ✓ text"
    assert shown("x" * 10, 5) == "xxxx…"


def test_the_escapes_are_json_escapes() -> None:
    """A JSON string that passes SafeStream still parses, to the same value."""
    text = json.dumps({"v": HOSTILE}, ensure_ascii=False)
    assert json.loads(for_stream(text)) == {"v": HOSTILE}


def test_the_stream_keeps_newlines_tabs_and_our_own_colours_only() -> None:
    out = for_stream(HOSTILE)
    assert not LEFT.search(OWN_SEQUENCE.sub("", out)), out
    assert "\x1b[8m" not in out and "\x1b]" not in out and "\x1b[2J" not in out
    assert out.endswith("\\r\n\tend")


def test_every_colour_reconcile_paints_passes_the_stream_unchanged() -> None:
    p = _Painter(colour=True)
    painted = [p.sym(s) for s in _SYMBOL_COLOUR] + [p.dim("d"), p.bold("b")]
    report = "".join(f"  {s} x\n" for s in _REPORT_SYMBOL) + "".join(f"Apply {v} in 1s\n" for v in _VERDICT)
    painted.append(paint_report(report))
    painted.append("\r\x1b[K" + "progress")  # reconcile.apply.progress's line
    for text in painted:
        assert for_stream(text) == text, repr(text)


def test_random_strings_leave_the_stream_without_a_control_sequence() -> None:
    rng = random.Random(24)
    alphabet = [chr(c) for c in range(0, 0xA0)] + ["\u2028", "\u2029", "[", "m", "K", "0", "1", ";", "3"]
    for _ in range(5000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        out = OWN_SEQUENCE.sub("", for_stream(text))
        assert not LEFT.search(out), (text, out)


def test_the_cli_prints_through_the_stream_and_puts_the_real_ones_back(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Any command's output, from any call site: an error naming a hostile spec path, for one."""
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    monkeypatch.setattr("sys.stderr", err)
    code = cli.main(["plan", "--spec", "/nonexistent/\x1b]0;pwned\x07.toml"])
    assert code == 1
    import sys

    assert sys.stdout is out and sys.stderr is err
    assert "\\u001b]0;pwned\\u0007" in err.getvalue() and "\x1b" not in err.getvalue(), err.getvalue()
    printed = SafeStream(out)
    printed.write("a\x1b[2Jb\n")
    assert out.getvalue().endswith("a\\u001b[2Jb\n")


# --- the chokepoint cannot be stepped around ----------------------------------------------------------

# Writing to the terminal around SafeStream: the real streams, their byte buffers, the raw fds.
# Reading sys.__stdout__'s size (argparsing) and handing huggingface_hub's progress bars the real
# stderr (actions/model.py: its own drawing, names checked first) are the two allowed uses.
ALLOWED = {("reconcile/argparsing.py", "__stdout__"), ("actions/model.py", "__stderr__")}


def _bypasses(path: Path) -> list[str]:
    found = []
    rel = str(path.relative_to(ROOT))
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        streams = ("__stdout__", "__stderr__", "buffer")
        if isinstance(node, ast.Attribute) and node.attr in streams and (rel, node.attr) not in ALLOWED:
            found.append(f"{rel}:{node.lineno}: {node.attr}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "write":
            owner = node.func.value
            if isinstance(owner, ast.Name) and owner.id == "os" and node.args:
                fd = node.args[0]
                if isinstance(fd, ast.Constant) and fd.value in (1, 2):
                    found.append(f"{rel}:{node.lineno}: os.write({fd.value}, ...)")
        if isinstance(node, ast.Constant) and node.value in ("/dev/tty", "/dev/stdout", "/dev/stderr"):
            found.append(f"{rel}:{node.lineno}: {node.value}")
    return found


def test_nothing_writes_to_the_terminal_around_the_safe_stream() -> None:
    found = [
        b
        for top in ("reconcile", "probes", "actions")
        for p in (ROOT / top).rglob("*.py")
        for b in _bypasses(p)
    ]
    assert found == [], found
