"""The spec cache's content key: equal keys only for texts that are the same TOML document."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tomlkit
from hypothesis import given, settings
from hypothesis import strategies as st

from reconcile.spec.key import content_key

REPO = Path(__file__).resolve().parent.parent
TEXTS = [p.read_text() for p in sorted((REPO / "specs").glob("*.toml"))]


def _doc(text: str) -> Any:
    try:
        return tomlkit.parse(text).unwrap()
    except Exception as exc:  # any refusal: the document is "invalid"
        return ("invalid", type(exc).__name__)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ('a = 1\nb = "x"\n', '# head\n\na = 1   # one\n  b = "x"\n\n# tail'),
        ("a = [\n  1,\n  2,\n]\n", "a = [  \n  # the first\n  1,\n\n  2, # the second\n]\n"),
        ("a = 1\r\nb = 2\r\n", "a = 1\r\n\r\n# c\r\nb = 2\r\n"),
    ],
)
def test_comments_indentation_and_blank_lines_do_not_change_the_key(a: str, b: str) -> None:
    assert _doc(a) == _doc(b)
    assert content_key(a) is not None and content_key(a) == content_key(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ('a = "x # y"\n', 'a = "x # z"\n'),
        ("a = 'x # y'\n", "a = 'x # z'\n"),
        ('a = """\nx\n\n# y\n"""\n', 'a = """\nx\n# y\n"""\n'),
        ("a = '''\n  x  \n'''\n", "a = '''\nx\n'''\n"),
        ('a = """x"""" # c\n', 'a = """x""" # c\n'),
        ("a = '''x'''' # c\n", "a = '''x''' # c\n"),
        ('a = "x\\" # y"\n', 'a = "x\\" # z"\n'),
        ('a = "x"  \nb = 1\n', 'a = "x" b = 1\n'),
        ("a =  1\n", "a = 1\n"),
        ("d = 1979-05-27  07:32:00\n", "d = 1979-05-27 07:32:00\n"),
    ],
)
def test_strings_and_spacing_within_a_line_are_content(a: str, b: str) -> None:
    assert content_key(a) != content_key(b)


@pytest.mark.parametrize(
    "text", ['a = "x\n"\n', "a = 'x\n'\n", "it's = 1\n", "a = 1 # \x01\n", "a = 1\rb = 2\n"]
)
def test_text_whose_strings_do_not_lex_has_no_key(text: str) -> None:
    assert content_key(text) is None


_PIECES = st.sampled_from(
    ["#", '"', "'", '"""', "'''", "\\", " ", "\t", "\n", "\r\n", "=", "x", "[", ",", "\x01"]
)


@st.composite
def _edited(draw: st.DrawFn) -> tuple[str, str]:
    """A real spec damaged at a few places, and that text with layout edits at a few more places."""
    text = draw(st.sampled_from(TEXTS))
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(_PIECES) + text[at:]
    newlines = [n for n, c in enumerate(text) if c == "\n"]
    other = text
    for at in sorted(draw(st.lists(st.sampled_from(newlines), min_size=1, max_size=4)), reverse=True):
        other = other[:at] + draw(st.sampled_from(["  # note", "\n", "\n   ", "   ", "\n# c\n"])) + other[at:]
    return text, other


@settings(max_examples=300, deadline=None)
@given(_edited())
def test_equal_keys_mean_the_same_document(pair: tuple[str, str]) -> None:
    a, b = pair
    ka, kb = content_key(a), content_key(b)
    if ka is not None and ka == kb:
        assert _doc(a) == _doc(b)
