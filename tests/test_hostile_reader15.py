"""Issue 24's hostile reader, fifteenth round: attacks on what the fourteenth round added (rule A and B of
the exec and value roles, the `-`-leading value rule, a URL's password kept as a hash, the remote-code rule
read as vLLM reads keys, the one-pass reading of a network location), found by reading docs/security.md
and the code alone, each run for real, each seen succeeding on main before its fix unless its docstring
says it was already refused.
"""

from __future__ import annotations

import pytest

from tests.apply_support import Demo
from tests.ownership_support import listening_as_nobody
from tests.test_hostile_reader13 import ROOT_ONLY

# --- class 4: a port written with leading zeros ------------------------------------------------------

ZEROS = "0" * 13  # the port's digits run past five; its value is PORT

# (variable, value with PORT for nobody's port); each seen reaching a listener on loopback through the
# tool named (a listener recording the connection, the real tool run with the variable set)
LEADING_ZEROS = [
    ("UV_INDEX_URL", f"http://127.0.0.1:{ZEROS}PORT/simple"),  # uv 0.9 (WHATWG: any number of zeros)
    ("PIP_INDEX_URL", f"http://127.0.0.1:{ZEROS}PORT/simple"),  # pip's urllib3: `:0*?(...)`, urlsplit too
    ("https_proxy", f"127.0.0.1:{ZEROS}PORT"),  # a proxy's bare host:port, read by urlsplit and urllib3
]


@ROOT_ONLY
@pytest.mark.parametrize(("name", "value"), LEADING_ZEROS, ids=["uv-url", "pip-url", "bare-proxy"])
def test_a_port_written_with_leading_zeros_is_held_to_the_listener_rule(
    demo: Demo, strangers: list[int], name: str, value: str
) -> None:
    """Round 14b made a port longer than 5 digits name no location (no tool reaches one past 65535),
    and the bare host:port pattern reads 1 to 5 digits not followed by another. But a port's value is
    not its length: WHATWG's URL standard (uv) and urllib3 (pip, huggingface_hub) and Python's urlsplit
    all read `:00000000000008000` as port 8000 (seen: uv's `--index-url` with 18 digits connected to a
    listener on loopback). main (seen): kept (no line), nobody's listener named by a 6+ digit port."""
    port = listening_as_nobody(strangers)
    value = value.replace("PORT", str(port))
    run = demo.cli("plan", env={name: value})
    assert f"reconcile: environment {name} left out: " in run.output, run.output
    assert f"port {port} on " in run.output and "listened on by nobody (uid 65534)" in run.output, run.output
    assert "Traceback" not in run.output, run.output
