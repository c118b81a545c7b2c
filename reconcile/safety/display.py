"""Strings from outside (server answers, log lines, process titles, hub names), made safe to show.

`shown()` makes one outside string fit for one line; `SafeStream` is the chokepoint: reconcile.cli
writes everything it prints through it, so whatever string a new call site forgets to pass through
`shown()` still reaches the terminal or the journal without a control character.
"""

from __future__ import annotations

import re

from reconcile.safety.names import CONTROL, INVISIBLE, SURROGATES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TextIO

# A control character is shown as its escape: `\n`, `\t`, `\r`, else `\u001b` (C0, DEL, C1, U+2028 and
# U+2029, the characters drawn as nothing of names.INVISIBLE (Unicode Cf and Default_Ignorable_Code_Point):
# `\u202e`, `\ufe0f`, and a lone surrogate, which no UTF-8 stream can write: `\ud800`). Visible, it says
# what was there, and each form is also a valid JSON escape, so `--json` output that passes through
# SafeStream stays JSON and decodes to the same string.
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}

# What reconcile itself writes: the colours of reconcile.plan.render (reset, bold, dim, red, green,
# yellow, magenta, bold red, bold green) and a progress line's carriage return + erase-line
# (reconcile.apply.progress). Only these pass SafeStream; no title, screen, cursor or clipboard
# sequence does, and no colour that hides text (SGR 8, black on black).
OWN_SEQUENCE = re.compile(r"\x1b\[(?:0|1|2|3[1235]|1;3[12])m|\r\x1b\[K")
_STREAM = re.compile(
    rf"({OWN_SEQUENCE.pattern})|[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029{INVISIBLE}{SURROGATES}]"
)


def escape(char: str) -> str:
    named = _NAMED.get(char)
    if named is not None:
        return named
    n = ord(char)
    if n > 0xFFFF:  # a tag character: its UTF-16 pair, as JSON writes it (`\ue0041` would read as two)
        n -= 0x10000
        return f"\\u{0xD800 + (n >> 10):04x}\\u{0xDC00 + (n & 0x3FF):04x}"
    return f"\\u{n:04x}"


# The longest a string from outside is shown, escapes included: a server answer well under the 1 MiB
# body cap (a 100,000-character `/version`, model id or log line) is one line of the plan, not a
# screenful, and no longer than this in `--json` either. Longer than any real version, model id,
# process title or path.
SHOWN_MAX = 1000


def shown(text: str, limit: int | None = SHOWN_MAX) -> str:
    """`text` from outside, for one line of output: every control character (newline included)
    escaped, cut to `limit` characters (with `…`): SHOWN_MAX unless the caller says (None: whole, for
    a caller that matches on it and cuts where it shows it)."""
    out = CONTROL.sub(lambda m: escape(m.group()), text)
    if limit is not None and len(out) > limit:
        return out[: limit - 1] + "…"
    return out


# The most arguments of another process's command line an observation keeps (each one `shown()`):
# a process title is data its process chose, up to the kernel's 2 MiB of arguments.
ARGV_MAX = 64


def shown_argv(argv: list[str]) -> tuple[str, ...]:
    """A command line read from /proc (a process title: data from outside), fit to observe and show:
    each argument `shown()`, at most ARGV_MAX of them (then `… N more`)."""
    out = [shown(a) for a in argv[:ARGV_MAX]]
    if len(argv) > ARGV_MAX:
        out.append(f"… {len(argv) - ARGV_MAX} more")
    return tuple(out)


def _stream_part(m: re.Match[str]) -> str:
    return m.group(1) or escape(m.group())


def for_stream(text: str) -> str:
    """What SafeStream writes for `text`: newlines, tabs and reconcile's own sequences kept, every
    other control character escaped."""
    return _STREAM.sub(_stream_part, text)


class SafeStream:
    """A text stream (stdout, stderr) that writes nothing with a control character other than a
    newline, a tab and reconcile's own colours. Everything else is the stream's own."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(for_stream(text))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding, ...
        return getattr(self.stream, name)
