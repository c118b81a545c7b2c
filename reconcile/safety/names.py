"""What a name from outside may be: no control character in any string reconcile writes or shows, and a
relative path that stays inside its directory for a name a hub listing, a download record or a source
tree hands us. Pure checks, used by the spec, the generated-file writers, the model probe and action."""

from __future__ import annotations

import os
import re

# One distribution of a locked closure (a lock file is data from outside), as pip's and uv's
# hash-checking mode read it: `name==version --hash=sha256:<64 hex> ...`.
LOCKED = (
    r"([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)==([A-Za-z0-9.+!_-]+)((?: --hash=sha256:[0-9a-f]{64})+)"
)
# C0, DEL, C1 and the Unicode line separators: each ends a line for some reader (a unit, an
# EnvironmentFile, cron, apt, a terminal). And every character a terminal draws as nothing: Unicode's
# Default_Ignorable_Code_Point (DerivedCoreProperties.txt, Unicode 15.1: tests/test_hostile_reader9b.py
# holds this class to that list) and every format character (category Cf, as of Unicode 14:
# tests/test_hostile_reader8b.py holds it to the interpreter's unicodedata), each of which changes what a
# terminal or a reviewer sees without showing itself: the bidi marks, embeddings, overrides and isolates
# (U+061C, U+200E/F, U+202A-E, U+2066-9: Trojan Source's reversed text), the zero-width space, joiners,
# word joiner, invisible operators and BOM (U+200B-D, U+2060-4, U+FEFF), (round 8: a list of instances
# had left them out) the soft hyphen, the Arabic and Syriac number signs, the Mongolian vowel separator,
# the deprecated U+206A-F, interlinear annotation, Kaithi, Egyptian, shorthand and musical format marks,
# the tag characters (U+E0001, U+E0020-7F), and (round 9: Cf is not the whole of "drawn as nothing")
# the combining grapheme joiner U+034F, the Hangul fillers U+115F, U+1160, U+3164, U+FFA0, the Khmer
# inherent vowels U+17B4/5, the Mongolian free variation selectors U+180B-F, every variation selector
# (U+FE00-F, U+E0100-E01EF) and the code points Unicode reserves as ignorable (U+2065, U+FFF0-8,
# U+E0000-E0FFF).
INVISIBLE = (
    "\u00ad\u034f\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u115f\u1160\u17b4\u17b5"
    "\u180b-\u180f\u200b-\u200f\u202a-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U00013438\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0000-\U000e0fff"
)
# And the surrogates, which no UTF-8 stream or file can hold alone: a JSON `\ud800` escape (a listener's
# answer, a damaged state file) decodes to one, and writing it raised UnicodeEncodeError (an internal
# error on every run that showed it); a `\udc9b` (as surrogateescape decodes a raw byte) was written as
# the raw byte 0x9b, an 8-bit terminal's CSI. A valid pair is one character, never matched here.
SURROGATES = "\ud800-\udfff"
CONTROL = re.compile(rf"[\x00-\x1f\x7f-\x9f\u2028\u2029{INVISIBLE}{SURROGATES}]")


def control_char(text: str) -> str | None:
    """The first control character of `text`, escaped for a message (`\\n`, `\\x1b`); None if none."""
    m = CONTROL.search(text)
    return repr(m.group())[1:-1] if m else None


def name_problem(name: object) -> str | None:
    """Why `name`, a "/"-separated path from outside, cannot be joined under a directory; None if it can.

    It must stay inside: no absolute path, no "..", "." or empty segment, no control character.
    """
    if not isinstance(name, str) or not name:
        return "is not a file name"
    if (bad := control_char(name)) is not None:
        return f"holds a control character ({bad})"
    if name.startswith("/"):
        return "is an absolute path"
    if any(part in ("", ".", "..") for part in name.split("/")):
        return "has a '..', '.' or empty path segment"
    return None


def is_inside(path: str, root: str) -> bool:
    """Whether `path` is `root` or below it once symlinks are resolved (in both)."""
    real, top = os.path.realpath(path), os.path.realpath(root)
    return real == top or real.startswith(top.rstrip("/") + "/")


def read_as(name: str, flag: str) -> bool:
    """Whether vLLM's argparse reads the `[server] args` key `name` as its long flag `flag` (without
    dashes): its `_` as `-`, or a prefix of it (argparse's abbreviation: `trust-remote` is
    trust-remote-code)."""
    given = name.replace("_", "-")
    return bool(given) and flag.startswith(given)
