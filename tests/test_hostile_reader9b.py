"""Issue 24's hostile reader, ninth round, classes 4-6 (bounded network reads, output is data, state
never wedges) and the process-ownership rules: attacks on what the eighth round added (the control
class as Unicode's Cf, the liveness parse's bounds, bench's keep() check, the pinned HAProxy master)
and on what no round attacked yet, found by reading docs/security.md and the code alone, each run for
real (a listener of `nobody` on the port, a hub listening on loopback, real files, FIFOs and links in
a real state directory), each seen succeeding on main before its fix unless its docstring says it was
already refused.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.apply_support import Demo, demo_in
from tests.ownership_support import as_nobody
from tests.test_network_attacks import HOSTILE

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a listener of another user)")


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    yield from demo_in(tmp_path)


# --- class 5: characters drawn as nothing that are not format characters (Cf) ---------------------

# Unicode's Default_Ignorable_Code_Point (DerivedCoreProperties.txt, Unicode 15.1): the characters a
# renderer draws as nothing unless it supports them. Most are Cf (round 8's rule); these are not: the
# combining grapheme joiner (Mn), the Hangul fillers U+115F, U+1160, U+3164, U+FFA0 (Lo), the Khmer
# inherent vowels (Mn), the Mongolian free variation selectors and every variation selector (Mn:
# U+FE00-FE0F, U+E0100-E01EF), and the ones still unassigned (Cn) that Unicode reserves as ignorable
# (U+2065, U+FFF0-FFF8, U+E0000, U+E0002-E001F, U+E0080-E00FF, U+E01F0-E0FFF).
DEFAULT_IGNORABLE = [
    *(0x00AD, 0x034F, 0x061C, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x3164, 0xFEFF, 0xFFA0),
    *range(0x180B, 0x1810),
    *range(0x200B, 0x2010),
    *range(0x202A, 0x202F),
    *range(0x2060, 0x2070),
    *range(0xFE00, 0xFE10),
    *range(0xFFF0, 0xFFF9),
    *range(0x1BCA0, 0x1BCA4),
    *range(0x1D173, 0x1D17B),
    *range(0xE0000, 0xE1000),
]
NOT_FORMAT = "\u034f\u115f\u1160\u17b4\u180b\u180f\u3164\ufe0f\uffa0\U000e0100\U000e01ef"


@ROOT_ONLY
def test_every_character_drawn_as_nothing_in_a_listeners_answer_is_shown_escaped(
    demo: Demo, strangers: list[int]
) -> None:
    """`nobody` on the port answers `/version` with `0.26.0` followed by characters a terminal draws
    as nothing that are not Unicode format characters (Cf): the combining grapheme joiner, Hangul
    fillers, Khmer inherent vowels, Mongolian and other variation selectors (VS16, VS17, VS256).
    main: `status` printed each raw (seen on main: 11 of 11), since round 8's rule was the category Cf.
    Now the rule is Unicode's Default_Ignorable_Code_Point (a superset of the Cf it held), with Cc, Cs,
    Zl, Zp, for shown(), SafeStream and spec values alike."""
    argv = ["/usr/bin/python3", "-c", HOSTILE, str(demo.port), "escapes", "*", json.dumps(NOT_FORMAT)]
    as_nobody(argv, {}, strangers)
    run = subprocess.run(
        demo.command("status"), capture_output=True, env=demo.env(), cwd=str(demo.root), timeout=120
    )
    text = (run.stdout + run.stderr).decode("utf-8")
    raw = [f"U+{ord(c):04X}" for c in NOT_FORMAT if c in text]
    assert raw == [], (raw, text[-2000:])
    escaped = "".join(
        f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else json.dumps(c).strip('"') for c in NOT_FORMAT
    )
    assert "0.26.0" + escaped in text, text[-2000:]


def test_the_control_class_holds_every_default_ignorable_character() -> None:
    """names.CONTROL against Unicode's Default_Ignorable_Code_Point list above (Python's unicodedata
    has no such property; the list is DerivedCoreProperties.txt's): every one is matched, so shown(),
    SafeStream and the spec's values escape or refuse each."""
    from reconcile.safety.names import CONTROL

    missed = [f"U+{cp:04X}" for cp in DEFAULT_IGNORABLE if not CONTROL.fullmatch(chr(cp))]
    assert missed == []


@pytest.mark.parametrize("text", ["\u0301" * 5000, "\ue000\uf8ff\U000f0000", "\u0378\U0003ffff"])
def test_marks_private_use_and_unassigned_characters_stay_within_one_shown_line(text: str) -> None:
    """Tried and already refused (seen on main): a stack of 5,000 combining marks on one letter (Mn,
    "Zalgo"), private-use characters (Co: a font's icons) and unassigned ones (Cn) are drawn as
    something, not nothing, and reorder nothing: shown() passes them, cut to SHOWN_MAX with no control
    character and no newline, so they stay on their one line of output."""
    from reconcile.safety.display import SHOWN_MAX, for_stream, shown

    out = shown("0.26.0" + text)
    assert len(out) <= SHOWN_MAX and "\n" not in out and for_stream(out) == out
