"""Two deployments on the one H200 with real vLLM 0.26.0 (issue 27). Skipped unless RECONCILE_GPU_LAB=1.

The lab spec's tiny Llama served twice, as deployments `one` (port 8001) and `two` (port 8002), each
placed on GPU 0 (gpus = [0]) at gpu-memory-utilization 0.3, each with its own model dir (a copy of
the same source), key, log and state subdir; one venv for both (equal inputs). Both must become
healthy and answer a chat through their own key only; a change to `two` restarts `two` and leaves
`one`'s pid alone; the over-subscribed variant (0.6 each: 1.2 of GPU 0) is refused by the plan with
the per-GPU sum, and apply changes nothing. Figures in $OUT/gpu-lab-multi.json.

    GPU_LAB_TESTS=tests/test_gpu_lab_multi.py tools/gpu_lab.sh
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.test_gpu_lab import GPU_LAB_MARKS, LAB, SPEC, cli, dump_figures, gpu_count, gpu_pids

pytestmark = GPU_LAB_MARKS  # gpu, and skipped without RECONCILE_GPU_LAB=1 (tests/test_gpu_lab.py)

FIGURES: dict[str, Any] = {}
PORTS = {"one": 8001, "two": 8002}
STATE = LAB / "state-multi"


def multi_spec(name: str, *, share: float = 0.3, two_args: str = "", running: bool = True) -> str:
    """The lab spec's machine part, then its [model]/[api_key]/[server] once per deployment."""
    text = SPEC.read_text()
    if gpu_count() > 1:
        text = text.replace("count = 1", f"count = {gpu_count()}")
    machine, serving = text[: text.index("\n[model]")], text[text.index("\n[model]") :]
    machine = machine.replace('state_dir = "/opt/reconcile-lab/state"', f'state_dir = "{STATE}"')
    out = [machine]
    for dep, port in PORTS.items():
        part = serving
        for section in ("model.config.rope_parameters", "model", "api_key", "server.env", "server"):
            part = part.replace(f"\n[{section}]", f"\n[deployments.{dep}.{section}]")
        replace = {
            '\nname = "tiny"': "" if running else "\nrunning = false",
            "port = 8000": f"port = {port}",
            'served_model_name = "tiny"': f'served_model_name = "{dep}"',
            "/opt/reconcile-lab/models/tiny-llama": f"/opt/reconcile-lab/models/multi-{dep}",
            "/opt/reconcile-lab/api.key": f"/opt/reconcile-lab/multi-{dep}.key",
            "/opt/reconcile-lab/tiny.log": f"/opt/reconcile-lab/multi-{dep}.log",
            "gpu-memory-utilization = 0.3": f"gpu-memory-utilization = {share}"
            + (two_args if dep == "two" else ""),
        }
        for old, new in replace.items():
            assert old in part, old
            part = part.replace(old, new)
        out.append(f"\n[deployments.{dep}]\ngpus = [0]\n{part}")
    path = LAB / f"spec-multi-{name}.toml"
    path.write_text("".join(out))
    return str(path)


def key(dep: str) -> str:
    return (LAB / f"multi-{dep}.key").read_text().strip()


def call(dep: str, method: str, path: str, key_of: str | None, body: Any = None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", PORTS[dep], timeout=60)
    headers = {"Content-Type": "application/json"}
    if key_of is not None:
        headers["Authorization"] = f"Bearer {key(key_of)}"
    conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
    resp = conn.getresponse()
    raw = resp.read()
    try:
        return resp.status, json.loads(raw or b"null")
    except ValueError:
        return resp.status, raw.decode(errors="replace")


def pid(dep: str) -> int:
    return int((STATE / "deployments" / dep / f"{dep}.pid").read_text().split()[0])


def ours_on_gpu() -> dict[str, float]:
    """GiB NVML shows per deployment (the processes the plan observes as each one's)."""
    _code, out, _err, _took = cli("plan", "--spec", multi_spec("a"), "--json")
    on_gpu = gpu_pids()
    shown = {}
    for dep, plan in json.loads(out)["deployments"].items():
        procs = plan["observed"]["server"]["processes"]
        shown[dep] = round(sum(on_gpu.get(p["pid"], 0) for p in procs) / 2**30, 2)
    return shown


@pytest.fixture(scope="module", autouse=True)
def figures() -> Iterator[None]:
    yield
    dump_figures(FIGURES, "gpu-lab-multi.json")
    cli("apply", "--spec", multi_spec("stop", running=False), "--auto-approve")


def test_two_tiny_models_share_the_gpu_both_healthy_each_through_its_own_key() -> None:
    code, out, err, took = cli("plan", "--spec", multi_spec("a"))
    assert code == 2, out + err
    assert "GPU 0: gpu-memory-utilization sums to 0.6 = 0.3 (one) + 0.3 (two); fits" in out
    code, out, err, took = cli("apply", "--spec", multi_spec("a"), "--auto-approve")
    FIGURES["apply_both_s"] = round(took, 1)
    assert code == 2, out + err
    assert out.count("Apply converged") == 2
    for dep in PORTS:
        assert call(dep, "GET", "/health", None)[0] == 200
        status, models = call(dep, "GET", "/v1/models", dep)
        assert status == 200 and [m["id"] for m in models["data"]] == [dep]
        assert call(dep, "GET", "/v1/models", None)[0] == 401
        other = "two" if dep == "one" else "one"
        assert call(dep, "GET", "/v1/models", other)[0] == 401  # the other deployment's key
        chat = {"model": dep, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        status, answer = call(dep, "POST", "/v1/chat/completions", dep, chat)
        assert status == 200 and answer["choices"], answer
    FIGURES["gpu_gib_per_deployment"] = ours_on_gpu()
    assert all(gib > 0 for gib in FIGURES["gpu_gib_per_deployment"].values())
    code, out, err, _took = cli("check", "--spec", multi_spec("a"))
    assert code == 0 and out.count("passed") == 2, out + err
    code, out, err, _took = cli("plan", "--spec", multi_spec("a"))
    assert code == 0 and out.count("No changes") == 2, out + err


def test_a_change_to_one_deployment_leaves_the_others_pid_alone() -> None:
    one, two = pid("one"), pid("two")
    changed = multi_spec("b", two_args=", max-num-seqs = 8")
    code, out, err, _took = cli("plan", "--spec", changed)
    assert code == 2 and "restart two" in out and "restart one" not in out, out + err
    started = time.monotonic()
    code, out, err, took = cli("apply", "--spec", changed, "--auto-approve")
    FIGURES["restart_two_s"] = round(took, 1)
    assert code == 2, out + err
    assert pid("one") == one and pid("two") != two
    argv = Path(f"/proc/{pid('two')}/cmdline").read_bytes().split(b"\0")
    assert argv[argv.index(b"--max-num-seqs") + 1] == b"8"
    assert call("one", "GET", "/v1/models", "one")[0] == 200
    assert call("two", "GET", "/v1/models", "two")[0] == 200
    FIGURES["one_pid_kept"] = pid("one") == one
    FIGURES["restart_wall_s"] = round(time.monotonic() - started, 1)


def test_the_over_subscribed_variant_is_refused_by_the_plan_and_apply_changes_nothing() -> None:
    one, two = pid("one"), pid("two")
    over = multi_spec("over", share=0.6, two_args=", max-num-seqs = 8")
    code, out, err, took = cli("plan", "--spec", over)
    FIGURES["refused_plan_s"] = round(took, 1)
    assert code == 1, out + err
    line = next(ln for ln in out.splitlines() if "GPU 0: gpu-memory-utilization sums to" in ln)
    FIGURES["refusal"] = line.strip()
    assert "sums to 1.2 = 0.6 (one) + 0.6 (two)" in line
    code, out, err, _took = cli("apply", "--spec", over, "--auto-approve")
    assert code == 1 and "preflight error(s) across deployments; nothing was changed" in out, out + err
    assert (pid("one"), pid("two")) == (one, two)
