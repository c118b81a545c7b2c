"""The converged CPU demo (specs/cpu-demo.toml, applied under /tmp/reconcile-demo), checked by pyinfra for
the same facts a converged `reconcile plan --spec specs/cpu-demo.toml` checks. Run as a dry run:
    pyinfra -y @local benchmarks/pyinfra/cpu_demo_check.py --dry
Converged: no operation would change anything. A fact pyinfra has no operation for (file sizes, JSON
content, an HTTP answer) is read with a command fact; when it differs, a `server.shell` operation that
would fix it is added, so it shows as a pending change. benchmarks/README.md lists the checks side by side.
"""

import json
import os
from typing import Any

# pyinfra lives in benchmarks/.venvs/tools only, where this file runs: no stubs for the test venv's mypy.
from pyinfra import host  # type: ignore[attr-defined,unused-ignore]
from pyinfra.facts.server import Command  # type: ignore[import-not-found,unused-ignore]
from pyinfra.operations import apt, files, pip, server  # type: ignore[import-not-found,unused-ignore]

ROOT = "/tmp/reconcile-demo"
VENV = f"{ROOT}/venv"
MODEL_DIR = f"{ROOT}/models/demo"
SOURCE = os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "specs", "demo-model")
)
ROPE = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 2048, "rope_theta": 10000.0}

apt.packages(name="apt: coreutils and bash installed", packages=["coreutils", "bash"])

files.line(
    name="venv: a venv without system site-packages",
    path=f"{VENV}/pyvenv.cfg",
    line="^include-system-site-packages *=.*$",
    replace="include-system-site-packages = false",
)
files.link(name="venv: bin/python is the interpreter link", path=f"{VENV}/bin/python", target="python3")
pip.packages(name="venv.packages: ninja installed", packages=["ninja"], virtualenv=VENV)


def sizes(directory: str) -> dict[str, int]:
    out = host.get_fact(Command, command=f"find {directory} -maxdepth 1 -type f -printf '%f %s\\n'") or ""
    return {name: int(size) for name, size in (line.rsplit(" ", 1) for line in out.splitlines() if line)}


def document(name: str) -> dict[str, Any]:
    return json.loads(host.get_fact(Command, command=f"cat {MODEL_DIR}/{name}") or "null") or {}


def merged(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in patch.items():
        out[key] = (
            merged(out[key], value) if isinstance(out.get(key), dict) and isinstance(value, dict) else value
        )
    return out


want, have = sizes(SOURCE), sizes(MODEL_DIR)
if "config.json.bak" in have:
    have["config.json"] = have["config.json.bak"]  # a patched config.json is judged by its original
record = document(".reconcile-model.json")
if (
    record.get("source") != SOURCE
    or any(have.get(n) != s for n, s in want.items())
    or any(have.get(n) != s for n, s in record.get("files", {}).items())
):
    server.shell(
        name="model.files: copy the source into the model dir", commands=[f"cp -a {SOURCE}/. {MODEL_DIR}/"]
    )
if document("config.json") != merged(document("config.json.bak"), {"rope_parameters": ROPE}):
    server.shell(name="model.config: merge rope_parameters into config.json", commands=["reconcile apply"])

files.file(
    name="api_key: a regular file, mode 0600, owner root",
    path=f"{ROOT}/api.key",
    mode="600",
    user="root",
    present=True,
    touch=False,
)
if host.get_fact(Command, command=f"stat -c %s {ROOT}/api.key") in (None, "0"):
    server.shell(name="api_key: generate a key", commands=["reconcile apply"])

health = "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:18000/health || true"
if host.get_fact(Command, command=health) != "200":
    server.shell(name="server: (re)start the demo server", commands=["reconcile apply"])
