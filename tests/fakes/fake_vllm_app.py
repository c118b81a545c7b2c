"""The fake vLLM's processes (the API server, its EngineCore/worker children) and its chat completion.

Imported by tests/fakes/vllm (the API server) and by the children it spawns through
`python3 -c "from multiprocessing.spawn import spawn_main; ..."`, as vLLM does without setproctitle.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from http.server import ThreadingHTTPServer

HERE = os.path.dirname(os.path.realpath(__file__))
CHILD_CODE = (
    "from multiprocessing.spawn import spawn_main; import sys; sys.path.insert(0, sys.argv[1]); "
    "import fake_vllm_app; fake_vllm_app.child_main(sys.argv[2:])"
)


def log(level: str, src: str, msg: str, who: str = "APIServer", pid: int = 0) -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"({who} pid={pid or os.getpid()}) {level} {stamp} [{src}] {msg}", flush=True)


def uvicorn(msg: str, level: str = "INFO") -> None:
    print(f"(APIServer pid={os.getpid()}) {level + ':':<9} {msg}", flush=True)


def set_comm(title: str) -> None:
    """What setproctitle does to `comm` (cut to 15 bytes by the kernel)."""
    if os.environ.get("FAKE_VLLM_SETPROCTITLE", "1") == "0":
        return
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None)
        libc.prctl(15, title.encode()[:15], 0, 0, 0)  # PR_SET_NAME


def clobber_environ(title: str) -> None:
    """What setproctitle does to a vLLM child (seen on an H200 with 0.26.0): the C environment is
    moved to the heap, then the original environ block, which /proc/PID/environ reads, is
    overwritten. The process keeps its variables; /proc no longer shows them, the marker included."""
    if os.environ.get("FAKE_VLLM_SETPROCTITLE", "1") == "0":
        return
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None)
        saved = dict(os.environ)
        libc.clearenv()
        for key, value in saved.items():
            libc.setenv(key.encode(), value.encode(), 1)
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[47]), int(fields[48])  # env_start, env_end (fields 50 and 51)
        ctypes.memset(start, 0, end - start)
        ctypes.memmove(start, title.encode(), min(len(title), end - start - 1))


def hold_dir(port: str) -> str:
    """Where the "GPU memory" locks live: FAKE_VLLM_HOLD, else one directory per API port (so
    unrelated fakes on one machine do not share a GPU, while a server and its stray do)."""
    import tempfile

    path = os.environ.get("FAKE_VLLM_HOLD") or os.path.join(tempfile.gettempdir(), f"fake-vllm-gpus-{port}")
    os.makedirs(path, exist_ok=True)
    return path


def spawn(title: str, extra: list) -> tuple:
    """Start a child like multiprocessing's spawn: same session, group, env, stdout; wait for its word."""
    r, w = os.pipe()
    argv = [sys.executable, "-c", CHILD_CODE, HERE, title, "--ready-fd", str(w), *extra]
    proc = subprocess.Popen(argv, pass_fds=(w,), stdin=subprocess.DEVNULL)
    os.close(w)
    with os.fdopen(r) as f:
        word = f.readline().strip()
    return proc, word == "ready"


def stop_children(procs: list, grace: float = 1.0) -> None:
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def on_stop(stop: threading.Event) -> None:
    """SIGTERM/SIGINT end the process; FAKE_VLLM_TERM_HANG=1 ignores them (a server stuck in shutdown)."""
    if os.environ.get("FAKE_VLLM_TERM_HANG") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())


GPU_GIB = 139.8  # an H200 as vLLM reports it


def claim_gpu(hold: str, rank: int, util: float) -> list | str:
    """Take `util` of fake GPU `rank` as vLLM's worker does (vllm/v1/worker/gpu_worker.py): it refuses to
    start when less than gpu-memory-utilization x total is free. Each holder keeps a shared flock on
    cuda<rank>.lock (held while any process holds the GPU) and an exclusive one on its own claim file
    holding its fraction; returns the open files to keep, or vLLM's error line."""
    with open(os.path.join(hold, f"cuda{rank}.admit"), "a") as admit:
        fcntl.flock(admit, fcntl.LOCK_EX)  # one admission at a time: the sum and the claim together
        used = 0.0
        for name in os.listdir(hold):
            if not name.startswith(f"cuda{rank}.claim."):
                continue
            other = os.path.join(hold, name)
            with open(other, "a+") as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # a live holder
                    f.seek(0)
                    used += float(f.read().strip() or "0.9")
                    continue
            os.unlink(other)  # its holder is gone
        if used + util > 1.0 + 1e-9:
            free = GPU_GIB * max(0.0, 1.0 - used)
            return (
                f"ValueError: Free memory on device cuda:{rank} ({free:.1f}/{GPU_GIB} GiB) on startup is "
                f"less than desired GPU memory utilization ({util}, {util * GPU_GIB:.1f} GiB). Decrease GPU "
                "memory utilization or reduce GPU memory used by other processes."
            )
        gpu = open(os.path.join(hold, f"cuda{rank}.lock"), "a+")  # noqa: SIM115 - held for life, like GPU memory
        fcntl.flock(gpu, fcntl.LOCK_SH)
        if used == 0.0:  # the first holder names itself
            gpu.truncate(0)
            gpu.write(f"{os.getpid()}\n")
            gpu.flush()
        mine = open(os.path.join(hold, f"cuda{rank}.claim.{os.getpid()}"), "a+")  # noqa: SIM115
        fcntl.flock(mine, fcntl.LOCK_EX)
        mine.truncate(0)
        mine.write(f"{util}\n")
        mine.flush()
        return [gpu, mine]


def child_main(argv: list) -> None:
    """EngineCore (holds cuda:0 at TP 1, else starts Worker_TP<i>) or a worker holding cuda:<rank>."""
    title, ready_fd = argv[0], int(argv[2])
    opts = {argv[i]: argv[i + 1] for i in range(3, len(argv) - 1, 2)}
    tp, rank, port = int(opts.get("--tp", "1")), int(opts.get("--rank", "0")), opts.get("--port", "0")
    who = "EngineCore_DP0" if title == "VLLM::EngineCore" else f"Worker_TP{rank}"
    set_comm(title)
    clobber_environ(title)
    stop = threading.Event()
    on_stop(stop)
    workers: list = []
    locks = []
    ok = True
    if title == "VLLM::EngineCore" and tp > 1:
        for i in range(tp):
            extra = ["--tp", str(tp), "--rank", str(i), "--port", port, "--util", opts.get("--util", "0.9")]
            proc, ready = spawn(f"VLLM::Worker_TP{i}", extra)
            workers.append(proc)
            ok = ok and ready
    else:
        claim = claim_gpu(hold_dir(port), rank, float(opts.get("--util", "0.9")))
        if isinstance(claim, str):
            log("ERROR", "core.py:708", "EngineCore failed to start.", who)
            print(claim, flush=True)
            ok = False
        else:
            locks += claim
    child_port = os.environ.get("FAKE_VLLM_CHILD_PORT")  # an engine-side socket, like its ZMQ ports
    if ok and child_port and title == "VLLM::EngineCore":
        import socket

        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", int(child_port)))
        sock.listen()
        locks.append(sock)
    with os.fdopen(ready_fd, "w") as f:
        f.write("ready\n" if ok else "failed\n")
    if not ok:
        stop_children(workers)
        sys.exit(1)
    lifetime = float(os.environ.get("FAKE_VLLM_MAX_LIFETIME", "0")) or None
    stop.wait(lifetime)  # a dead parent does not end us: only a signal (or the test leak guard) does
    stop_children(workers)
    sys.exit(0)


def serve(args: object, state: object, handler: type, *, exit_on_engine_death: bool) -> int:
    """The API server: engine children first, then the port after the load delay, until a signal."""
    set_comm("vllm")
    stop = threading.Event()
    on_stop(stop)
    version, model, names = state.version, state.model, state.names  # type: ignore[attr-defined]
    max_model_len = state.max_model_len  # type: ignore[attr-defined]
    tp = getattr(args, "tensor_parallel_size", None) or 1
    host, port = getattr(args, "host", None) or "0.0.0.0", getattr(args, "port", None) or 8000
    log("INFO", "api_server.py:1885", f"vLLM API server version {version}")
    shown = {k: v for k, v in sorted(vars(args).items()) if v is not None and k != "subparser"}
    if "api_key" in shown:
        shown["api_key"] = "(secret)"
    log("INFO", "utils.py:253", f"non-default args: {shown}")
    log("INFO", "model.py:1510", f"Using max model len {max_model_len}")
    util = getattr(args, "gpu_memory_utilization", None) or 0.9
    engine, ready = spawn("VLLM::EngineCore", ["--tp", str(tp), "--port", str(port), "--util", str(util)])
    log(
        "INFO",
        "core.py:93",
        f"Initializing a V1 LLM engine (v{version}) with config: model='{model}', "
        f"tensor_parallel_size={tp}, served_model_name={names[0]}",
        "EngineCore_DP0",
        engine.pid,
    )
    if not ready:
        print(
            "RuntimeError: Engine core initialization failed. See root cause above. "
            f"Failed core proc(s): {{'EngineCore_DP0': {engine.wait()}}}",
            flush=True,
        )
        return 1
    if not load_model(engine.pid, model, stop):
        stop_children([engine])
        return 0
    # _HEX: a line with bytes a spec cannot hold (control characters), as a hostile model's code could log
    failure = os.environ.get("FAKE_VLLM_FAIL_WITH") or bytes.fromhex(
        os.environ.get("FAKE_VLLM_FAIL_WITH_HEX", "")
    ).decode("utf-8", "replace")
    if failure:
        print(f"(EngineCore_DP0 pid={engine.pid}) {failure}", flush=True)
        print(
            "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
            flush=True,
        )
        stop_children([engine])
        return 1
    kv_tokens = int(os.environ.get("FAKE_VLLM_KV_TOKENS", "4194304"))
    core = ("EngineCore_DP0", engine.pid)
    log("INFO", "gpu_worker.py:298", "Available KV cache memory: 1.00 GiB", *core)
    log("INFO", "kv_cache_utils.py:1087", f"GPU KV cache size: {kv_tokens:,} tokens", *core)
    log(
        "INFO",
        "kv_cache_utils.py:1091",
        f"Maximum concurrency for {max_model_len:,} tokens per request: {kv_tokens / max_model_len:.2f}x",
        *core,
    )
    if max_model_len > kv_tokens:
        print(
            f"ValueError: To serve at least one request with the models's max seq len ({max_model_len}), "
            f"({max_model_len * 3072 / 2**30:.2f} GiB KV cache is needed, which is larger than the "
            "available KV cache memory (1.00 GiB). Based on the available memory, the estimated maximum "
            f"model length is {kv_tokens}.",
            flush=True,
        )
        stop_children([engine])
        return 1
    bound = type("Handler", (handler,), {"state": state})
    ThreadingHTTPServer.allow_reuse_address = True
    ThreadingHTTPServer.daemon_threads = True
    try:
        httpd = ThreadingHTTPServer((host, port), bound)
    except OSError as exc:
        uvicorn(
            f"[Errno {exc.errno}] error while attempting to bind on address ('{host}', {port}): "
            f"{exc.strerror.lower() if exc.strerror else exc}",
            "ERROR",
        )
        stop_children([engine])
        return 1
    print(
        f"(EngineCore_DP0 pid={engine.pid}) Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): "
        "100%|██████████| 67/67 [00:00<00:00, 95.31it/s]",
        flush=True,
    )
    if stop.wait(float(os.environ.get("FAKE_VLLM_STARTUP_DELAY", "1.0")) / 3):  # capturing takes a while
        stop_children([engine])
        return 0
    log("INFO", "gpu_model_runner.py:3480", "Graph capturing finished in 1 secs, took 0.05 GiB", *core)
    log(
        "INFO", "core.py:210", "init engine (profile, create kv cache, warmup model) took 1.52 seconds", *core
    )
    log("INFO", "api_server.py:1951", f"Starting vLLM API server 0 on http://{host}:{port}")
    uvicorn(f"Started server process [{os.getpid()}]")
    uvicorn("Waiting for application startup.")
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    uvicorn("Application startup complete.")
    watch_engine(engine, state, stop, exit_on_engine_death)
    lifetime = float(os.environ.get("FAKE_VLLM_MAX_LIFETIME", "0")) or None
    stop.wait(lifetime)
    uvicorn("Shutting down")
    httpd.shutdown()
    stop_children([engine])
    uvicorn(f"Finished server process [{os.getpid()}]")
    return 0


def load_model(pid: int, model: str, stop: threading.Event) -> bool:
    """vLLM 0.26's log lines of a model load and torch.compile, spread over FAKE_VLLM_STARTUP_DELAY;
    FAKE_VLLM_SILENT_S adds a stretch with no output (a stuck download or compile). False: stopped."""
    delay = float(os.environ.get("FAKE_VLLM_STARTUP_DELAY", "1.0"))
    core = ("EngineCore_DP0", pid)
    steps = [
        ("gpu_model_runner.py:2602", f"Starting to load model {model}..."),
        ("default_loader.py:267", f"Loading weights took {delay / 5:.2f} seconds"),
        ("gpu_model_runner.py:2653", f"Model loading took 0.01 GiB and {delay / 4:.6f} seconds"),
        (
            "backends.py:548",
            "Using cache directory: /root/.cache/vllm/torch_compile_cache/0 for vLLM's torch.compile",
        ),
        ("backends.py:559", f"Dynamo bytecode transform time: {delay / 5:.2f} s"),
        ("monitor.py:34", f"torch.compile takes {delay / 5:.2f} s in total"),
    ]
    for i, (src, msg) in enumerate(steps):
        log("INFO", src, msg, *core)
        if stop.wait(delay / len(steps)):
            return False
        if i == 0 and stop.wait(float(os.environ.get("FAKE_VLLM_SILENT_S", "0"))):
            return False
    return True


def watch_engine(engine: subprocess.Popen, state: object, stop: threading.Event, exit_on_death: bool) -> None:
    """Engine death: /health turns 503 (0.11+); 0.10.x answers 500 and the server exits."""

    def run() -> None:
        while engine.poll() is None and not stop.is_set():
            time.sleep(0.1)
        if stop.is_set():
            return
        log(
            "ERROR",
            "core_client.py:564",
            "Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.",
        )
        state.engine_dead = True  # type: ignore[attr-defined]
        if exit_on_death:
            time.sleep(0.5)
            stop.set()

    threading.Thread(target=run, daemon=True).start()


def error(code: int, kind: str, message: str) -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def example_value(schema: dict, prompt: str) -> object:
    kind = schema.get("type", "string")
    if schema.get("enum"):
        return schema["enum"][0]
    if kind == "string":
        words = [w.strip("?.,!") for w in prompt.split() if w[:1].isupper()]
        return words[-1] if words else "example"
    return {"integer": 1, "number": 1.0, "boolean": True, "array": [], "object": {}}.get(kind, "example")


def chat(st: object, req: dict, v: tuple) -> tuple:
    """A deterministic chat completion: reasoning fields by version, forced tool calls as JSON strings.

    FAKE_VLLM_CHAT_FAIL=1: healthy, but every completion fails (a model that loads and cannot answer)."""
    if os.environ.get("FAKE_VLLM_CHAT_FAIL") == "1":
        return 500, error(500, "InternalServerError", "EngineCore encountered an issue. See stack trace")
    if req.get("model") is not None and req["model"] not in st.names:
        return 404, error(404, "NotFoundError", f"The model `{req['model']}` does not exist.")
    prompt = ""
    for m in req.get("messages") or []:
        content = m.get("content")
        if m.get("role") == "user":
            parts = [content] if isinstance(content, str) else [p.get("text", "") for p in content or []]
            prompt = " ".join(parts)
    tools, choice, args = req.get("tools") or [], req.get("tool_choice"), st.args
    if (
        choice == "auto"
        and tools
        and not (getattr(args, "enable_auto_tool_choice", None) and getattr(args, "tool_call_parser", None))
    ):
        return 400, error(
            400,
            "BadRequestError",
            '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
        )
    forced = None
    if isinstance(choice, dict):
        wanted = (choice.get("function") or {}).get("name")
        forced = next((t for t in tools if t.get("function", {}).get("name") == wanted), None)
        if forced is None:
            return 400, error(400, "BadRequestError", f"Tool '{wanted}' has not been passed in `tools`.")
    elif choice == "required" and tools:
        forced = tools[0]
    structured = forced is not None or (req.get("response_format") or {}).get("type") == "json_schema"
    if structured and "lmformatenforcer" in os.environ.get("FAKE_VLLM_MISSING_MODULES", "").split(","):
        # What vLLM 0.26 answered on the H200 lab when a --no-deps venv lacked lm-format-enforcer:
        # a 500 whose message is empty (the ModuleNotFoundError stays in the server's log).
        return 500, error(500, "InternalServerError", "")
    answer = (
        "The capital of France is Paris."
        if "France" in prompt
        else f"This is the fake vLLM's answer to: {prompt[:60]}"
    )
    message: dict = {"role": "assistant", "content": answer, "tool_calls": []}
    if forced is not None:
        fn = forced["function"]
        props = (fn.get("parameters") or {}).get("properties") or {}
        arguments = {
            k: example_value(props.get(k, {}), prompt)
            for k in (fn.get("parameters") or {}).get("required") or []
        }
        message["content"] = None
        message["tool_calls"] = [
            {
                "id": f"chatcmpl-tool-{uuid.uuid4().hex[:16]}",
                "type": "function",
                "function": {"name": fn["name"], "arguments": json.dumps(arguments)},
            }
        ]
    thought = None
    if getattr(args, "reasoning_parser", None):
        thought = f"The user asks: {prompt[:80]}. Answer briefly."
    if v < (0, 16, 0):
        message["reasoning_content"] = thought
    if v >= (0, 11, 1):
        message["reasoning"] = thought
    prompt_tokens, completion_tokens = len(prompt.split()) + 8, len((answer or "").split())
    with st.lock:
        st.counts["success"] += 1
        st.counts["prompt"] += prompt_tokens
        st.counts["generation"] += completion_tokens
    return 200, {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": st.names[0],
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "tool_calls" if forced is not None else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
