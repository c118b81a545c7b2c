"""A spec file's text without its comments and layout: what the spec cache compares on a hit.

Called by reconcile.spec.cache. Two texts with the same key mean the same TOML document, so a comment
edit, a re-indent or a checkout that rewrote the file is still a cache hit. Strings are kept byte for
byte, so a `#` or a blank line inside one is content; anything this lexer cannot place (a quote that
does not close on its line) gives no key, and the cache then compares the whole text.
"""

from __future__ import annotations

import re

# TOML's four strings, each kept verbatim. A multi-line string may end in up to two more quotes
# ("""a"""" is `a"`); a one-line string never spans a newline.
_STRING = (
    r'"""(?:[^"\\]|\\[\s\S]|"(?!""))*"""(?:""|")?'
    r"|'''[\s\S]*?'''(?:''|')?"
    r'|"(?:[^"\\\r\n]|\\[^\r\n])*"'
    r"|'[^'\r\n]*'"
)
# A comment may hold tabs but no other control character (TOML's rule: such a file is invalid, and
# must stay a miss). Blank space around a newline, comments and blank lines fold into one newline.
_COMMENT = r"#[^\x00-\x08\x0a-\x1f\x7f]*"
_BREAK = rf"[ \t]*(?:{_COMMENT})?(?:(?:\r?\n[ \t]*(?:{_COMMENT})?)+|\Z)"
# Compiled on first use (by re's cache, ~0.5 ms): a warm plan whose spec files' stamps are unchanged
# never lexes them.
_TOKEN = rf"(?P<s>{_STRING})|(?P<b>{_BREAK})|(?P<q>[\"'#\r])"


class _Unplaced(Exception):
    pass


def _one(m: re.Match[str]) -> str:
    if m.group("s") is not None:
        return m.group("s")
    if m.group("b") is not None:
        return "\n" if m.group("b") else ""  # an empty match at a position is no blank space
    raise _Unplaced  # a quote that opens no string, a comment with a control char, a lone CR


def content_key(text: str) -> str | None:
    """`text` with comments, indentation and blank lines gone; None when its strings do not lex."""
    try:
        return re.sub(_TOKEN, _one, text).strip("\n")
    except _Unplaced:
        return None
