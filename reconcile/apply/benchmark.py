"""`reconcile bench`: the reference deployment's benchmark table, measured by the field's own load
generator (`vllm bench serve` from the deployment's venv) against the running server with its key,
each run with the machine it ran on (reconcile.apply.bench_records keeps them per generation).

Called by the bench command and by reconcile.apply.bench_gate (after a switch passed its acceptance
check).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

from reconcile.errors import ReconcileError
from reconcile.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from reconcile.spec.models import Spec

# The reference table (shared/reference/nemotron-on-blackwell.txt, section 5), at max-model-len 1,048,576.
REFERENCE_LEN = 1_048_576
REFERENCE_PROMPTS = (243, 927, 3658, 14580, 58270, 116524)
SINGLE_GEN, LONG_PROMPT, LONG_GEN, CONCURRENT = 512, 24, 1024, 8
TEMPLATE_ROOM = 64  # the chat template's tokens around a prompt, kept free of the context


class Row(Record):
    name: str
    prompt: int
    gen: int
    concurrency: int
    requests: int


class BenchError(ReconcileError):
    """The benchmark could not run or measured nothing."""


def profile(spec: Spec, max_model_len: int) -> list[Row]:
    """The spec's [bench] rows, else the reference table scaled to `max_model_len`: single streams at
    prompt sizes in the reference's proportions, a long generation, 8 concurrent streams."""
    bench = spec.bench
    room = max_model_len - TEMPLATE_ROOM
    if bench is not None and bench.rows:
        rows = []
        for i, r in enumerate(bench.rows):
            if r.prompt + r.gen > room:
                raise BenchError(
                    f"[bench].rows[{i}]: prompt {r.prompt} + gen {r.gen} does not fit max-model-len "
                    f"{max_model_len} (less {TEMPLATE_ROOM} for the chat template): make them smaller"
                )
            name = f"{r.concurrency}x" if r.concurrency > 1 else "single"
            rows.append(Row(name, r.prompt, r.gen, r.concurrency, r.requests or r.concurrency))
        return rows
    gen = max(1, min(SINGLE_GEN, room // 2))
    prompts: list[int] = []
    for ref in REFERENCE_PROMPTS:
        size = min(max(16, round(ref * max_model_len / REFERENCE_LEN)), room - gen)
        if size >= 1 and size not in prompts:
            prompts.append(size)
    rows = [Row("single", p, gen, 1, 1) for p in prompts]
    rows.append(Row("long", min(LONG_PROMPT, room // 4), max(1, min(LONG_GEN, room - LONG_PROMPT)), 1, 1))
    rows.append(Row(f"{CONCURRENT}x", min(LONG_PROMPT, room // 4), gen, CONCURRENT, CONCURRENT))
    return rows


def figures(result: dict[str, Any]) -> dict[str, float]:
    """The reference's columns from one `vllm bench serve` result (its JSON's field names): prompt and
    gen per request, TTFT and total seconds, decode tok/s (gen / total, as the reference computes it),
    and the aggregate output tok/s over the run."""
    try:
        done = int(result.get("completed") or 0)
        if done < 1:
            raise BenchError(f"vllm bench serve completed no request ({result.get('failed', '?')} failed)")
        gen = float(result["total_output_tokens"]) / done
        total = float(result["mean_e2el_ms"]) / 1000
        out = {
            "prompt": float(result["total_input_tokens"]) / done,
            "gen": gen,
            "ttft_s": float(result["mean_ttft_ms"]) / 1000,
            "total_s": total,
            "decode_tok_s": gen / total if total > 0 else 0.0,
            "aggregate_tok_s": float(result["output_throughput"]),
        }
    except KeyError as exc:
        raise BenchError(f"vllm bench serve's result has no {exc.args[0]!r}") from None
    except (TypeError, ValueError, OverflowError) as exc:
        raise BenchError(f"vllm bench serve's result has a value that is not a number: {exc}") from None
    # Its counts are sums of the server's `usage` answers: data. NaN or an infinity kept in
    # bench/results.json would make its reader (finite numbers only) move every run aside.
    bad = [k for k, v in out.items() if v - v != 0]
    if bad:
        raise BenchError(f"vllm bench serve's result gives {', '.join(bad)} that is not a finite number")
    return out


def _command(spec: Spec, row: Row, url: str, out_dir: str) -> list[str]:
    from actions.launching import executable  # the deployment's venv's vllm (or [server] executable)
    from reconcile.safety.filesafety import resolve_exec

    assert spec.server is not None
    program = resolve_exec(executable(spec), what="[server].executable")
    backend = spec.bench.backend if spec.bench is not None else "openai-chat"
    model = spec.server.model or (spec.model.dir if spec.model is not None else "")
    served = spec.server.served_model_name or model
    return [
        program,
        "bench",
        "serve",
        "--backend",
        backend,
        "--base-url",
        url,
        "--endpoint",
        "/v1/chat/completions" if backend == "openai-chat" else "/v1/completions",
        "--model",
        model,
        "--served-model-name",
        served,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(row.prompt),
        "--random-output-len",
        str(row.gen),
        "--num-prompts",
        str(row.requests),
        "--max-concurrency",
        str(row.concurrency),
        "--ignore-eos",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,99",
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        out_dir,
        "--result-filename",
        "result.json",
    ]


def _environment(spec: Spec, key: str | None) -> dict[str, str]:
    """A clean environment: the venv's bin first, offline hub (the tokenizer is the model dir's), the
    key where `vllm bench serve` reads it (never on its command line)."""
    path = os.environ.get("PATH") or "/usr/local/bin:/usr/bin:/bin"
    if spec.venv is not None:
        path = f"{spec.venv.path.rstrip('/')}/bin:{path}"
    env = {"PATH": path, "HOME": os.environ.get("HOME") or "/root", "LANG": "C.UTF-8"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if key:
        env["OPENAI_API_KEY"] = key
    return env


def _read_result(path: str) -> dict[str, Any]:
    from reconcile.safety.untrusted import load_json, read_regular

    try:
        data = load_json(read_regular(path, 16 << 20))
    except FileNotFoundError:
        raise BenchError("vllm bench serve wrote no result file") from None
    except (OSError, ValueError) as exc:
        raise BenchError(f"vllm bench serve's result is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BenchError("vllm bench serve's result is not a JSON object")
    return data


def machine_state(spec: Spec, vllm_version: str | None) -> dict[str, Any]:
    """GPU (name, count) and driver from NVML, the vLLM version the server answers with."""
    from probes.gpu import GpuInventory, probe

    gpus = probe(spec)
    if isinstance(gpus, GpuInventory) and gpus.gpus:
        return {
            "gpu": gpus.gpus[0].name,
            "gpus": len(gpus.gpus),
            "driver": gpus.driver_version,
            "vllm": vllm_version,
        }
    return {"gpu": None, "gpus": 0, "driver": None, "vllm": vllm_version}


def run(spec: Spec, *, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the profile against the running server; returns the run (rows with their figures and the
    vLLM result of each, the machine state). The key goes only to a listener proven ours."""
    from actions.launching import read_api_key
    from probes.health import probe
    from reconcile.host import CommandTimeout, ToolMissing
    from reconcile.host import run as run_command
    from reconcile.identity import endpoint_text
    from reconcile.safety.filesafety import UnsafePath

    say = progress or (lambda _line: None)
    if spec.server is None:
        raise BenchError("the spec has no [server]: nothing to benchmark")
    health = probe(spec)  # /health, /version, then /v1/models with the key once the port is proven ours
    if health.foreign_listener:
        raise BenchError(f"{health.url}: {health.error}: the key is not sent there")
    if health.state != "healthy" or not health.models:
        why = health.error or f"/health answered {health.health_status}"
        raise BenchError(f"{health.url} is not serving ({health.state}: {why}): `reconcile apply` first")
    _still_ours(spec)  # nothing measured, and no key sent, unless every listener is the deployment's
    declared = spec.server.args.get("max-model-len")
    max_len = health.max_model_len or (declared if isinstance(declared, int) else 2048)
    rows = profile(spec, max_len)
    key = read_api_key(spec, required=False)
    env = _environment(spec, key)
    started, out = time.monotonic(), []
    scratch = tempfile.mkdtemp(prefix="reconcile-bench-")  # 0700, ours
    relay = _GuardedRelay(spec)  # vllm bench serve talks to the port only through it
    try:
        for i, row in enumerate(rows, 1):
            what = f"{row.concurrency} x " if row.concurrency > 1 else ""
            say(
                f"bench {i}/{len(rows)}: {what}prompt {row.prompt}, gen {row.gen} "
                f"({time.monotonic() - started:.0f}s elapsed)"
            )
            row_dir = os.path.join(scratch, str(i))
            _still_ours(spec)  # the server may have gone since the last row, and its port been taken
            try:
                argv = _command(spec, row, relay.url, row_dir)
                done = run_command(argv, env=env, timeout=spec.bench.timeout if spec.bench else 600.0)
            except (CommandTimeout, ToolMissing, UnsafePath) as exc:
                raise BenchError(f"vllm bench serve: {exc}") from None
            if relay.refused:
                raise BenchError(f"{endpoint_text(spec)}: {relay.refused[0]}: the key is not sent there")
            if not done.ok:
                tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
                raise BenchError(f"vllm bench serve exited {done.returncode}: {tail[-400:]}")
            result = _read_result(os.path.join(row_dir, "result.json"))
            out.append({**row._asdict(), "figures": figures(result), "vllm_result": _trimmed(result)})
    finally:
        relay.close()
        shutil.rmtree(scratch, ignore_errors=True)
    say(f"bench done in {time.monotonic() - started:.0f}s")
    return {
        "at": time.time(),
        "machine": machine_state(spec, health.version),
        "rows": out,
        "server": spec.server.name,
        "max_model_len": max_len,
    }


class _GuardedRelay:
    """A loopback port of ours that `vllm bench serve` sends its keyed requests to: each connection is
    carried to the deployment's port (a color's socket) only once key_guard found the listener there to
    be the deployment's, after the connect and before a byte is sent (as probes.health's guard does for
    reconcile's own requests). `_still_ours` before a row is not enough: vLLM's CLI imports for
    seconds before its first request, and a server that died meanwhile leaves the port to whoever
    binds it. A refused connection is closed unsent and named in `refused`."""

    def __init__(self, spec: Spec) -> None:
        import socket
        import threading

        from reconcile.identity import endpoint
        from reconcile.ownership.sockets import key_guard

        self._target = endpoint(spec)
        self._check: Callable[[], None] = key_guard(spec)
        self.refused: list[str] = []
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, name="bench-relay", daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed: the bench is over
                return
            threading.Thread(target=self._carry, args=(client,), daemon=True).start()

    def _carry(self, client: Any) -> None:
        import socket
        import threading

        from reconcile.ownership.sockets import ForeignListener

        where, port = self._target
        try:
            if port == 0:  # a color's Unix socket (reconcile.identity.endpoint)
                upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    upstream.settimeout(30)
                    upstream.connect(where)
                except OSError:
                    upstream.close()
                    raise
            else:
                upstream = socket.create_connection(self._target, timeout=30)
        except OSError:
            client.close()
            return
        try:
            self._check()
        except ForeignListener as exc:
            self.refused.append(str(exc))
            upstream.close()
            client.close()
            return
        upstream.settimeout(None)
        back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
        back.start()
        _pump(client, upstream)
        back.join()
        upstream.close()
        client.close()

    def close(self) -> None:
        self._listener.close()


def _pump(src: Any, dst: Any) -> None:
    """Bytes from `src` to `dst` until `src` ends, then end `dst`'s sending side."""
    import contextlib
    import socket

    with contextlib.suppress(OSError):
        while chunk := src.recv(1 << 16):
            dst.sendall(chunk)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


def _still_ours(spec: Spec) -> None:
    """Every listener on the port is the deployment's, or BenchError: the key goes nowhere else."""
    from reconcile.identity import endpoint_text
    from reconcile.ownership.sockets import ForeignListener, key_guard

    try:
        key_guard(spec)()
    except ForeignListener as exc:
        raise BenchError(f"{endpoint_text(spec)}: {exc}: the key is not sent there") from None


def _trimmed(result: dict[str, Any]) -> dict[str, Any]:
    """vLLM's result without per-request lists (as its own --save-result leaves them out)."""
    return {k: v for k, v in result.items() if not isinstance(v, (list, dict))}
