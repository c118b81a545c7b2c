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
import socket
import socketserver
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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


def spawn(title: str, extra: list, keep: tuple = ()) -> tuple:
    """Start a child like multiprocessing's spawn: same session, group, env, stdout; wait for its word.
    `keep`: more descriptors the child inherits (the EngineCore's pipes)."""
    r, w = os.pipe()
    argv = [sys.executable, "-c", CHILD_CODE, HERE, title, "--ready-fd", str(w), *extra]
    proc = subprocess.Popen(argv, pass_fds=(w, *keep), stdin=subprocess.DEVNULL)
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
        gpu = open(os.path.join(hold, f"cuda{rank}.lock"), "a+")  # noqa: SIM115 - held for life, like GPU memory
        try:
            fcntl.flock(gpu, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # an exclusive holder: another program has the whole GPU's memory
            gpu.close()
            used = 1.0
        if used + util > 1.0 + 1e-9:
            if not gpu.closed:
                gpu.close()
            free = GPU_GIB * max(0.0, 1.0 - used)
            return (
                f"ValueError: Free memory on device cuda:{rank} ({free:.1f}/{GPU_GIB} GiB) on startup is "
                f"less than desired GPU memory utilization ({util}, {util * GPU_GIB:.1f} GiB). Decrease GPU "
                "memory utilization or reduce GPU memory used by other processes."
            )
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
    if title == "VLLM::EngineCore":
        start_engine_core(opts, stop)
    lifetime = float(os.environ.get("FAKE_VLLM_MAX_LIFETIME", "0")) or None
    stop.wait(lifetime)  # a dead parent does not end us: only a signal (or the test leak guard) does
    stop_children(workers)
    sys.exit(0)


class UvicornServer(ThreadingHTTPServer):
    """The HTTP side of uvicorn 0.51 (vLLM 0.26.0's), as its stop treats connections (uvicorn/server.py
    Server.shutdown): the listener closes first (the kernel resets every connection still in its accept
    queue, a request sent on it or not); then each open connection without a request in progress (none
    sent yet, or between two on a kept-alive one: h11/httptools' `cycle is None or response_complete`)
    is closed unanswered; a request whose headers were read is answered (the drain), and its
    connection is not kept alive. The handler reports a request's headers read (`request_read`)."""

    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = 2048  # uvicorn's backlog: a burst of connects is not dropped

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.conn_lock = threading.Lock()
        self.waiting: set = set()  # open connections with no request in progress
        self.closing = False

    def process_request(self, request: object, client_address: object) -> None:
        self.between_requests(request)
        super().process_request(request, client_address)  # type: ignore[arg-type]

    def between_requests(self, conn: object) -> None:
        with self.conn_lock:
            self.waiting.add(conn)

    def request_read(self, conn: object) -> bool:
        """A request's headers were read on `conn`: False when the stop already closed it (not answered)."""
        with self.conn_lock:
            if self.closing and conn not in self.waiting:
                return False
            self.waiting.discard(conn)
            return True

    def close_listener_and_waiting(self) -> int:
        """uvicorn's first steps of a stop: server.close(), then connection.shutdown() on each; returns
        how many open connections were closed without an answer."""
        self.shutdown()  # the accept loop ends
        self.server_close()  # the listening socket: the kernel resets what is left in its queue
        with self.conn_lock:
            self.closing = True
            waiting, self.waiting = list(self.waiting), set()
        for conn in waiting:  # transport.close(): the handler's blocked read ends, nothing is answered
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)  # type: ignore[attr-defined]
        return len(waiting)


class UnixUvicornServer(UvicornServer):
    """`vllm serve --uds PATH` (0.26.0's api_server.create_server_unix_socket): a plain bind of the path,
    which fails on one that exists; --host and --port are ignored."""

    address_family = socket.AF_UNIX

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)  # HTTPServer's would read a host and a port from it

    def get_request(self) -> tuple:
        conn, _ = self.socket.accept()
        return conn, ("unix", 0)  # an unnamed peer: the request log's host:port


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
    # vLLM 0.26.0 binds its port before it builds the engine (api_server.setup_server: SO_REUSEADDR, no
    # listen) and listens only once the engine is up (uvicorn's startup): while the model loads, a
    # connection is refused, a bind without SO_REUSEADDR fails, and one with it succeeds (Linux lets two
    # such sockets share a port until one listens). A port already listened on fails here, at once.
    uds = getattr(args, "uds", None)
    httpd: UvicornServer = (
        UnixUvicornServer(uds, BaseHTTPRequestHandler, bind_and_activate=False)
        if isinstance(uds, str)
        else UvicornServer((host, port), BaseHTTPRequestHandler, bind_and_activate=False)
    )
    try:
        httpd.server_bind()
    except OSError as exc:
        httpd.server_close()
        print("Traceback (most recent call last):", flush=True)
        print(f"OSError: [Errno {exc.errno}] {exc.strerror or exc}", flush=True)
        return 1
    log("INFO", "model.py:1510", f"Using max model len {max_model_len}")
    util = getattr(args, "gpu_memory_utilization", None) or 0.9
    engine, ready, state.engine_core = spawn_engine(tp, port, util)  # type: ignore[attr-defined]
    state.engine_pid = engine.pid  # type: ignore[attr-defined]
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
    httpd.RequestHandlerClass = type("Handler", (handler,), {"state": state})
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
    listening = f"unix:{uds}" if isinstance(uds, str) else f"http://{host}:{port}"
    log("INFO", "api_server.py:1951", f"Starting vLLM API server 0 on {listening}")
    uvicorn(f"Started server process [{os.getpid()}]")
    uvicorn("Waiting for application startup.")
    try:
        httpd.server_activate()  # uvicorn's listen(): another socket of the port listened meanwhile
    except OSError as exc:
        uvicorn(f"[Errno {exc.errno}] {exc.strerror or exc}", "ERROR")
        httpd.server_close()
        stop_children([engine])
        return 1
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    uvicorn("Application startup complete.")
    watch_engine(engine, state, stop, exit_on_engine_death)
    lifetime = float(os.environ.get("FAKE_VLLM_MAX_LIFETIME", "0")) or None
    until = time.monotonic() + lifetime if lifetime else None
    # uvicorn's main loop looks at should_exit every 0.1 s; a tick here also runs a SIGTERM that the
    # kernel gave to another thread (a lock wait of the main thread is not woken by it).
    while not stop.wait(0.1) and (until is None or time.monotonic() < until):
        pass
    shut_down(httpd, state, int(getattr(args, "shutdown_timeout", None) or 0))
    stop_children([engine])
    uvicorn(f"Finished server process [{os.getpid()}]")
    return 0


def shut_down(httpd: UvicornServer, state: object, drain: int) -> None:
    """vLLM 0.26's stop on SIGTERM (seen on an H200): the listening socket closes at once (new
    connections are refused; no 503 phase; one already queued is reset, and an open one with no
    request read yet is closed unanswered: UvicornServer). With --shutdown-timeout N the requests in
    flight finish (up to N s); without it they end within a second, each stream with finish_reason
    "abort" and a clean [DONE], and the listener closes only after that: a request read meanwhile
    gets a 500 (SHUT_DOWN), as on the H200."""
    engine = engine_of(state)
    mode = "drain" if drain > 0 else "abort"
    log("INFO", "launcher.py:150", f"stopping engine client mode={mode} timeout={drain}s")
    if drain <= 0:
        # vLLM 0.26's launcher stops the engine client first and the HTTP server after it: in abort mode
        # a request read meanwhile gets a 500 (17 of them in the H200 lab's switch under load, 2026-12-02).
        engine.abort_all(shut=True)
        engine.wait_idle(1.0)
    uvicorn("Shutting down")
    httpd.close_listener_and_waiting()
    with engine.cond:
        count = engine.inflight
    if drain > 0:
        core = ("EngineCore_DP0", engine.pid)
        log("INFO", "core.py:1210", f"draining in-flight requests count={count}", *core)
        if engine.wait_idle(drain):
            return
        log("WARNING", "core.py:1224", f"drain timed out after {drain}s: aborting the rest", "EngineCore_DP0")
    engine.abort_all()
    engine.wait_idle(1.0)


def compile_cache(model: str) -> str:
    """vLLM's torch.compile cache dir: $VLLM_CACHE_ROOT (default ~/.cache/vllm, vllm/envs.py), then
    torch_compile_cache/<config hash>/rank_0_0/backbone. vLLM's hash covers far more (dtype,
    parallelism, compilation config, max_num_batched_tokens, ...); the fake's covers the model only, and
    the tests that look at it change only gpu-memory-utilization, which vLLM leaves out too."""
    import hashlib

    root = os.environ.get("VLLM_CACHE_ROOT") or os.path.join(os.path.expanduser("~"), ".cache", "vllm")
    key = hashlib.sha256(model.encode()).hexdigest()[:10]
    return os.path.join(root, "torch_compile_cache", key, "rank_0_0", "backbone")


def compiled(cache: str, delay: float) -> tuple[str, str]:
    """A warm start loads the compiled graph from the cache; a cold one compiles it and saves it there."""
    artifact = os.path.join(cache, "cache_key_factors.json")
    if os.path.isfile(artifact):
        loaded = "Directly load the compiled graph(s) for compile range (1, 8192) from the cache"
        return ("backends.py:293", f"{loaded}, "
                f"took {delay / 50:.3f} s")  # fmt: skip
    os.makedirs(cache, exist_ok=True)
    with open(artifact, "w") as f:
        f.write("{}\n")
    return ("backends.py:394", f"Compiling a graph for compile range (1, 8192) takes {delay / 5:.2f} s")


def load_model(pid: int, model: str, stop: threading.Event) -> bool:
    """vLLM 0.26's log lines of a model load and torch.compile, spread over FAKE_VLLM_STARTUP_DELAY;
    FAKE_VLLM_SILENT_S adds a stretch with no output (a stuck download or compile). False: stopped."""
    delay = float(os.environ.get("FAKE_VLLM_STARTUP_DELAY", "1.0"))
    core = ("EngineCore_DP0", pid)
    steps = [
        # the V2 model runner's line: 0.26 takes it for the architectures it supports, Llama among them
        # (seen on the H200 lab with the tiny Llama; the V1 runner's is "Starting to load model NAME...")
        ("model_runner.py:284", "Loading model from scratch..."),
        ("default_loader.py:267", f"Loading weights took {delay / 5:.2f} seconds"),
        ("gpu_model_runner.py:2653", f"Model loading took 0.01 GiB and {delay / 4:.6f} seconds"),
        ("backends.py:548", f"Using cache directory: {compile_cache(model)} for vLLM's torch.compile"),
        compiled(compile_cache(model), delay),
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


# What vLLM 0.26 answers a request read after its engine client shut down (the executor's RuntimeError).
SHUT_DOWN = "cannot schedule new futures after shutdown"


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
    if choice not in (None, "none", "auto") and not getattr(args, "tool_call_parser", None):
        # vLLM 0.26.0's renderer refuses a named or required choice without a parser before structured
        # outputs are reached (seen on the H200 lab: a named get_weather answered 400 with this message)
        named = isinstance(choice, dict) and (choice.get("function") or {}).get("name")
        desc = f'function "{named}"' if isinstance(choice, dict) else f'"{choice}"'
        return 400, error(400, "BadRequestError", f"tool_choice={desc} requires --tool-call-parser to be set")
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
    prompt_tokens = tokens_of(prompt) + 8
    max_tokens, err = max_tokens_of(req, st, prompt_tokens)
    if err:
        return 400, err
    if forced is not None:  # the model writes the call as Hermes' text; JSON takes about 4 characters a token
        call = message["tool_calls"][0]["function"]
        text = json.dumps({"name": call["name"], "arguments": json.loads(call["arguments"])})
        text = f"<tool_call>\n{text}\n</tool_call>"
        words, reason = [text[i : i + 4] for i in range(0, len(text), 4)], "tool_calls"
    else:
        words, reason = message["content"].split() or ["."], "stop"
    completion_tokens, said = 0, ""
    try:
        ignore_eos = bool(req.get("ignore_eos"))
        for _, text, finished in engine_of(st).generate(prompt_tokens, words, max_tokens, ignore_eos):
            completion_tokens += 1  # each token timed and counted by the engine
            said += text
            reason = finished if finished in ("length", "abort") else reason
    except EngineDead:
        return 500, error(500, "EngineDeadError", "EngineCore encountered an issue. See stack trace")
    if message["content"]:
        message["content"] = said
    elif reason == "length":  # a call cut by max_tokens is text the parser cannot read, not a tool call
        message["content"], message["tool_calls"] = said, []
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
                "finish_reason": reason,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


# --- The engine's work: timed tokens, a bounded batch, streaming, and the /metrics it moves -------------
#
# Timing (env, read per request so a test can set it at launch):
#   FAKE_VLLM_TOKEN_S          seconds per generated token (decode), default 0.002
#   FAKE_VLLM_PREFILL_BASE_S   seconds of every prefill, default 0.005
#   FAKE_VLLM_PREFILL_TOKEN_S  seconds per prompt token of prefill, default 0.00002 (50k tok/s)
# Concurrency: `--max-num-seqs N` (vLLM's flag; FAKE_VLLM_MAX_NUM_SEQS when the flag is absent, else 256):
# at most N requests run, the rest wait in order (vllm:num_requests_waiting). A stopped EngineCore
# (SIGSTOP) moves no token while /health still answers 200, as seen on the H200 with vLLM 0.26.0.

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0]
LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0]
FINISHED_REASONS = ["stop", "length", "abort", "error", "repetition"]
HELP = {  # tests/fixtures/vllm-metrics/0.26.0-captured.txt
    "num_requests_running": "Number of requests in model execution batches.",
    "num_requests_waiting": "Number of requests waiting to be processed.",
    "kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
    "num_preemptions_total": "Cumulative number of preemption from the engine.",
    "prompt_tokens_total": "Number of prefill tokens processed.",
    "generation_tokens_total": "Number of generation tokens processed.",
    "request_success_total": "Count of successfully processed requests.",
    "request_prompt_tokens": "Number of prefill tokens processed.",
    "request_generation_tokens": "Number of generation tokens processed.",
    "time_to_first_token_seconds": "Histogram of time to first token in seconds.",
    "inter_token_latency_seconds": "Histogram of inter-token latency in seconds.",
    "request_time_per_output_token_seconds": "Histogram of time_per_output_token_seconds per request.",
    "e2e_request_latency_seconds": "Histogram of e2e request latency in seconds.",
    "request_queue_time_seconds": "Histogram of time spent in WAITING phase for request.",
    "request_inference_time_seconds": "Histogram of time spent in RUNNING phase for request.",
    "request_prefill_time_seconds": "Histogram of time spent in PREFILL phase for request.",
    "request_decode_time_seconds": "Histogram of time spent in DECODE phase for request.",
}
FILLER = ["and", "then", "the", "fake", "model", "keeps", "talking", "about", "nothing", "in", "particular"]


def buckets_1_2_5(maximum: int) -> list:
    """vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to the maximum."""
    out, exponent = [], 0
    while True:
        for m in (1, 2, 5):
            value = m * 10**exponent
            if value > maximum:
                return out
            out.append(float(value))
        exponent += 1


class Histogram:
    def __init__(self, buckets: list) -> None:
        self.buckets, self.counts, self.sum, self.count = buckets, [0] * len(buckets), 0.0, 0

    def observe(self, value: float) -> None:
        self.sum += value
        self.count += 1
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1

    def lines(self, name: str, label: str) -> list:
        engine, model = label.split(",", 1)  # prometheus_client sorts the labels: engine, le, model_name
        pairs = zip(self.buckets, self.counts, strict=True)
        out = [f'{name}_bucket{{{engine},le="{b}",{model}}} {float(c)}' for b, c in pairs]
        out.append(f'{name}_bucket{{{engine},le="+Inf",{model}}} {float(self.count)}')
        return [*out, f"{name}_count{{{label}}} {float(self.count)}", f"{name}_sum{{{label}}} {self.sum}"]


class EngineDead(Exception):
    """The EngineCore died under a request."""


class Engine:
    """What the EngineCore does for the API server: admits up to max_num_seqs, prefills, decodes."""

    def __init__(self, max_num_seqs: int, max_model_len: int) -> None:
        self.max_num_seqs = max(1, max_num_seqs)
        self.cond = threading.Condition()
        self.running = 0
        self.waiting = 0
        self.queue: list = []
        self.aborting = False  # a stop without --shutdown-timeout: every request ends now, "abort"
        self.shut = False  # the engine client shut down before the HTTP server (abort mode's window)
        self.inflight = 0  # HTTP requests being answered (the drain waits for them)
        self.pid = 0  # the EngineCore's pid, once serve() started it
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success = dict.fromkeys(FINISHED_REASONS, 0)
        self.hist = {
            "time_to_first_token_seconds": Histogram(TTFT_BUCKETS),
            "inter_token_latency_seconds": Histogram(ITL_BUCKETS),
            "request_time_per_output_token_seconds": Histogram(ITL_BUCKETS),
            "e2e_request_latency_seconds": Histogram(LATENCY_BUCKETS),
            "request_queue_time_seconds": Histogram(LATENCY_BUCKETS),
            "request_prefill_time_seconds": Histogram(LATENCY_BUCKETS),
            "request_decode_time_seconds": Histogram(LATENCY_BUCKETS),
            "request_inference_time_seconds": Histogram(LATENCY_BUCKETS),
            "request_prompt_tokens": Histogram(buckets_1_2_5(max_model_len)),
            "request_generation_tokens": Histogram(buckets_1_2_5(max_model_len)),
        }

    def stopped(self) -> bool:
        """The EngineCore is stopped (SIGSTOP: state T); EngineDead when it is gone."""
        if not self.pid:
            return False
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            state = b"X"
        if state in (b"Z", b"X"):
            raise EngineDead
        return state in (b"T", b"t")

    def step(self, seconds: float) -> None:
        """One engine step of `seconds`; it does not finish while the EngineCore makes no progress."""
        core = getattr(self, "core", None)
        if core is not None:  # the EngineCore process takes the step (see EngineCoreClient)
            core.step(seconds)
            return
        time.sleep(seconds)
        while self.stopped():
            time.sleep(0.05)

    def admit(self) -> bool:
        """Wait for a slot; False when the server aborts its requests meanwhile."""
        ticket = object()
        with self.cond:
            self.queue.append(ticket)
            self.waiting += 1
            while (self.running >= self.max_num_seqs or self.queue[0] is not ticket) and not self.aborting:
                self.cond.wait()
            self.queue.remove(ticket)
            self.waiting -= 1
            if self.aborting:
                self.cond.notify_all()
                return False
            self.running += 1
            self.cond.notify_all()
            return True

    @contextlib.contextmanager
    def answering(self):
        """One HTTP request in flight, for the drain to wait on."""
        with self.cond:
            self.inflight += 1
        try:
            yield
        finally:
            with self.cond:
                self.inflight -= 1
                self.cond.notify_all()

    def abort_all(self, *, shut: bool = False) -> None:
        """Every request ends now ("abort"); `shut`: the engine client is shut down, and a request
        that comes after gets vLLM's 500 (SHUT_DOWN)."""
        with self.cond:
            self.aborting = True
            self.shut = self.shut or shut
            self.cond.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Until no request is in flight (True) or `timeout` passed (False)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.inflight and time.monotonic() < deadline:
                self.cond.wait(min(0.1, max(0.0, deadline - time.monotonic())))
            return not self.inflight

    def release(self) -> None:
        with self.cond:
            self.running -= 1
            self.cond.notify_all()

    def generate(self, prompt_tokens: int, words: list, max_tokens: int | None, ignore_eos: bool):
        """Yields (index, text, finish_reason or None) per token, timed like an engine: queue, prefill
        (grows with the prompt), then one decode step per token. The caller must exhaust or close it."""
        token_s = float(os.environ.get("FAKE_VLLM_TOKEN_S", "0.002"))
        prefill_s = float(os.environ.get("FAKE_VLLM_PREFILL_BASE_S", "0.005")) + prompt_tokens * float(
            os.environ.get("FAKE_VLLM_PREFILL_TOKEN_S", "0.00002")
        )
        limit = max_tokens if max_tokens is not None else len(words)
        if not ignore_eos:
            limit = min(limit, len(words))
        limit = max(1, limit)
        arrived = time.monotonic()
        if not self.admit():
            with self.cond:
                self.success["abort"] += 1
            yield 0, "", "abort"
            return
        started = time.monotonic()
        first = last = started
        produced, reason = 0, "abort"
        try:
            self.step(prefill_s)
            first = last = time.monotonic()
            for i in range(limit):
                if self.aborting:  # vLLM's abort on SIGTERM: the stream ends early, cleanly
                    reason = "abort"
                    yield i, "", "abort"
                    return
                if i:
                    self.step(token_s)
                    now = time.monotonic()
                    with self.cond:
                        self.hist["inter_token_latency_seconds"].observe(now - last)
                    last = now
                word = words[i] if i < len(words) else FILLER[(i - len(words)) % len(FILLER)]
                produced += 1
                with self.cond:
                    self.generation_tokens += 1
                    if i == 0:
                        self.prompt_tokens += prompt_tokens
                        self.hist["time_to_first_token_seconds"].observe(first - arrived)
                done = i == limit - 1
                reason = ("stop" if limit >= len(words) and not ignore_eos else "length") if done else reason
                yield i, (" " if i else "") + word, reason if done else None
        finally:
            end = time.monotonic()
            self.release()
            with self.cond:
                self.success[reason] += 1
                h = self.hist
                h["e2e_request_latency_seconds"].observe(end - arrived)
                h["request_queue_time_seconds"].observe(started - arrived)
                h["request_prefill_time_seconds"].observe(first - started)
                h["request_decode_time_seconds"].observe(last - first)
                h["request_inference_time_seconds"].observe(end - started)
                h["request_prompt_tokens"].observe(prompt_tokens)
                h["request_generation_tokens"].observe(produced)
                if produced > 1:
                    h["request_time_per_output_token_seconds"].observe((last - first) / (produced - 1))


def engine_of(st: object) -> Engine:
    """The server's Engine, made on first use from --max-num-seqs and max_model_len."""
    with st.lock:  # type: ignore[attr-defined]
        engine = getattr(st, "engine", None)
        if engine is None:
            seqs = getattr(st.args, "max_num_seqs", None) or int(  # type: ignore[attr-defined]
                os.environ.get("FAKE_VLLM_MAX_NUM_SEQS", "256")
            )
            engine = Engine(int(seqs), st.max_model_len)  # type: ignore[attr-defined]
            engine.pid = getattr(st, "engine_pid", 0)
            engine.core = getattr(st, "engine_core", None)  # type: ignore[attr-defined]
            st.engine = engine  # type: ignore[attr-defined]
        return engine


def tokens_of(text: str) -> int:
    """The fake tokenizer: one token per whitespace-separated word."""
    return len(text.split())


def max_tokens_of(req: dict, st: object, prompt_tokens: int) -> tuple:
    """(max_tokens, error): vLLM's check that prompt + max_tokens fit in max_model_len."""
    value = req.get("max_completion_tokens") or req.get("max_tokens")
    room = st.max_model_len - prompt_tokens  # type: ignore[attr-defined]
    if value is not None and (not isinstance(value, int) or value < 1):
        return None, error(400, "BadRequestError", f"max_tokens must be at least 1, got {value}.")
    if room <= 0 or (value is not None and value > room):
        return None, error(
            400,
            "BadRequestError",
            f"This model's maximum context length is {st.max_model_len} tokens. However, you requested "  # type: ignore[attr-defined]
            f"{(value or 0) + prompt_tokens} tokens ({prompt_tokens} in the messages, {value or 0} in the "
            "completion). Please reduce the length of the messages or completion.",
        )
    return value, None


def sse(handler: object, events) -> None:
    """Server-Sent Events as uvicorn sends vLLM's stream: chunked, one `data: ...` event per chunk."""
    h = handler
    h.send_response(200)  # type: ignore[attr-defined]
    h.send_header("content-type", "text/event-stream; charset=utf-8")  # type: ignore[attr-defined]
    h.send_header("transfer-encoding", "chunked")  # type: ignore[attr-defined]
    h.end_headers()  # type: ignore[attr-defined]
    try:
        for data in events:
            text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))  # pydantic's
            raw = f"data: {text}\n\n".encode()
            h.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")  # type: ignore[attr-defined]
            h.wfile.flush()  # type: ignore[attr-defined]
        h.wfile.write(b"0\r\n\r\n")  # type: ignore[attr-defined]
        h.wfile.flush()  # type: ignore[attr-defined]
    except (BrokenPipeError, ConnectionResetError, EngineDead):
        h.close_connection = True  # type: ignore[attr-defined]
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()  # a client gone mid-stream: the engine frees its slot (an "abort")


def chat_prompt(req: dict) -> str:
    prompt = ""
    for m in req.get("messages") or []:
        content = m.get("content")
        if m.get("role") == "user":
            parts = [content] if isinstance(content, str) else [p.get("text", "") for p in content or []]
            prompt = " ".join(parts)
    return prompt


def answer_words(prompt: str) -> list:
    answer = (
        "The capital of France is Paris."
        if "France" in prompt
        else f"This is the fake vLLM's answer to: {prompt[:60]}"
    )
    return answer.split()


def stream_chat(st: object, req: dict) -> tuple:
    """(status, body or event iterator) for a chat completion with `stream: true`, in vLLM's chunks:
    the role chunk, content deltas, finish_reason (and stop_reason) on the last content chunk, with
    `stream_options.include_usage` a chunk with empty choices and the usage, then [DONE]."""
    if os.environ.get("FAKE_VLLM_CHAT_FAIL") == "1":
        return 500, error(500, "InternalServerError", "EngineCore encountered an issue. See stack trace")
    if req.get("model") is not None and req["model"] not in st.names:  # type: ignore[attr-defined]
        return 404, error(404, "NotFoundError", f"The model `{req['model']}` does not exist.")
    prompt = chat_prompt(req)
    prompt_tokens = tokens_of(prompt) + 8  # the chat template's tokens
    max_tokens, err = max_tokens_of(req, st, prompt_tokens)
    if err:
        return 400, err
    return 200, chunks(st, req, "chat", prompt_tokens, answer_words(prompt), max_tokens)


def stream_completion(st: object, req: dict) -> tuple:
    """/v1/completions with `stream: true`: text deltas (no role chunk, no "object" key on the deltas,
    as vLLM's exclude_unset leaves it), the usage chunk, then [DONE]."""
    if req.get("model") is not None and req["model"] not in st.names:  # type: ignore[attr-defined]
        return 404, error(404, "NotFoundError", f"The model `{req['model']}` does not exist.")
    prompt = req.get("prompt")
    if isinstance(prompt, list):
        prompt = " ".join(str(p) for p in prompt)
    if not isinstance(prompt, str):
        return 400, error(400, "BadRequestError", "prompt must be a string")
    prompt_tokens = tokens_of(prompt) + 1  # BOS
    max_tokens, err = max_tokens_of(req, st, prompt_tokens)
    if err:
        return 400, err
    limit = 16 if max_tokens is None else max_tokens  # the completions API's default
    return 200, chunks(st, req, "completion", prompt_tokens, answer_words(prompt), limit)


def chunks(st: object, req: dict, kind: str, prompt_tokens: int, words: list, max_tokens: int | None):
    engine = engine_of(st)
    ident = f"chatcmpl-{uuid.uuid4().hex}" if kind == "chat" else f"cmpl-{uuid.uuid4().hex}"
    created, model = int(time.time()), req.get("model") or st.names[0]  # type: ignore[attr-defined]
    head: dict = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": model}
    if kind == "completion":
        head = {"id": ident, "created": created, "model": model}
    include_usage = bool((req.get("stream_options") or {}).get("include_usage"))
    produced = 0
    gen = engine.generate(prompt_tokens, words, max_tokens, bool(req.get("ignore_eos")))
    try:
        for i, text, reason in gen:
            produced += 1
            if kind == "chat":
                if i == 0:
                    role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None}
                    yield {**head, "choices": [role]}
                choice: dict = {"index": 0, "delta": {"content": text}, "logprobs": None,
                                "finish_reason": reason}
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
            if reason is not None or kind == "completion":
                choice["stop_reason"] = None
            yield {**head, "choices": [choice]}
    finally:
        gen.close()
    if include_usage:
        usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + produced,
                 "completion_tokens": produced}
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        yield {"id": ident, "object": obj, "created": created, "model": model, "choices": [], "usage": usage}
    yield "[DONE]"


def complete(st: object, req: dict) -> tuple:
    """/v1/completions without streaming, timed through the engine like a streamed one."""
    status, events = stream_completion(st, {**req, "stream_options": {"include_usage": True}})
    if status != 200:
        return status, events
    text, reason, usage, ident, created = "", None, {}, "", 0
    try:
        seen = list(events)
    except EngineDead:
        return 500, error(500, "EngineDeadError", "EngineCore encountered an issue. See stack trace")
    for event in seen:
        if isinstance(event, dict):
            ident, created = event["id"], event["created"]
            for c in event["choices"]:
                text += c["text"]
                reason = c["finish_reason"] or reason
            usage = event.get("usage") or usage
    model = req.get("model") or st.names[0]  # type: ignore[attr-defined]
    return 200, {
        "id": ident, "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason, "stop_reason": None,
                     "prompt_logprobs": None}],
        "usage": usage,
    }


def metrics_text(st: object) -> str:
    """/metrics as prometheus_client writes vLLM's: HELP, TYPE, then samples, from the engine's work."""
    engine = engine_of(st)
    label = f'engine="0",model_name="{st.names[0]}"'  # type: ignore[attr-defined]
    usage = float(os.environ.get("FAKE_VLLM_KV_CACHE_USAGE", "0"))  # what a loaded server shows
    with engine.cond:
        rows = [("num_requests_running", "gauge", engine.running),
                ("num_requests_waiting", "gauge", engine.waiting),
                ("kv_cache_usage_perc", "gauge", usage), ("num_preemptions_total", "counter", 0.0),
                ("prompt_tokens_total", "counter", engine.prompt_tokens + st.counts["prompt"]),  # type: ignore[attr-defined]
                ("generation_tokens_total", "counter", engine.generation_tokens)]
        success = dict(engine.success)
        hists = {name: (list(h.counts), h.count, h.sum, h.buckets) for name, h in engine.hist.items()}
    import re as _re

    v = tuple(int(x) for x in _re.findall(r"\d+", st.version)[:3])  # type: ignore[attr-defined]
    if v < (0, 12, 0):
        rows.append(("gpu_cache_usage_perc", "gauge", 0.0))
    out = []
    for name, kind, value in rows:  # HELP and TYPE named as vLLM 0.26's prometheus_client writes them
        helptext = HELP.get(name, name.replace("_", " "))
        out += [f"# HELP vllm:{name} {helptext}", f"# TYPE vllm:{name} {kind}",
                f"vllm:{name}{{{label}}} {float(value)}"]
    out += [f"# HELP vllm:request_success_total {HELP['request_success_total']}",
            "# TYPE vllm:request_success_total counter"]
    out += [f'vllm:request_success_total{{engine="0",finished_reason="{r}",model_name="{st.names[0]}"}} '  # type: ignore[attr-defined]
            f"{float(n)}" for r, n in success.items()]
    for name, (counts, count, total, buckets) in hists.items():
        h = Histogram(buckets)
        h.counts, h.count, h.sum = counts, count, total
        out += [f"# HELP vllm:{name} {HELP.get(name, name)}", f"# TYPE vllm:{name} histogram"]
        out += h.lines(f"vllm:{name}", label)
    return "\n".join(out) + "\n"


# --- the EngineCore process takes the engine's steps: the API server hands each over a pipe --------------
# As in vLLM's V1 engine, where the API server sends requests to the `VLLM::EngineCore` process (a ZMQ
# socket there, two pipes of JSON lines here) and every token comes back from it: each step of the
# Engine above (a prefill, one decode token) is sent to the child, which takes the step's time and
# answers. A stopped EngineCore (SIGSTOP) answers nothing, so no token moves and every completion waits
# while the API server still answers /health with 200; a dead one closes its pipe: EngineDead.


def spawn_engine(tp: int, port: object, util: object = 0.9) -> tuple:
    """The EngineCore child with its two pipes: (proc, ready, EngineCoreClient or None when it failed)."""
    to_core_r, to_core_w = os.pipe()
    from_core_r, from_core_w = os.pipe()
    extra = ["--tp", str(tp), "--port", str(port), "--util", str(util)]
    extra += ["--steps-fd", str(to_core_r), "--done-fd", str(from_core_w)]
    proc, ready = spawn("VLLM::EngineCore", extra, keep=(to_core_r, from_core_w))
    os.close(to_core_r)
    os.close(from_core_w)
    if not ready:
        os.close(to_core_w)
        os.close(from_core_r)
        return proc, False, None
    return proc, True, EngineCoreClient(to_core_w, from_core_r)


def start_engine_core(opts: dict, stop: threading.Event) -> None:
    """In the EngineCore child: take the steps the API server sends, each its own time, several at once
    (a batch's requests step together), and answer each when done."""
    if "--steps-fd" not in opts or "--done-fd" not in opts:
        return
    steps, done = int(opts["--steps-fd"]), int(opts["--done-fd"])
    threading.Thread(target=engine_core_loop, args=(steps, done, stop), daemon=True).start()


def engine_core_loop(steps_fd: int, done_fd: int, stop: threading.Event) -> None:
    import heapq
    import queue

    inbox: queue.Queue = queue.Queue()

    def read() -> None:
        with os.fdopen(steps_fd, "rb") as f:
            for line in f:
                inbox.put(json.loads(line))
        inbox.put(None)  # the API server is gone

    threading.Thread(target=read, daemon=True).start()
    out = os.fdopen(done_fd, "wb", buffering=0)
    due: list = []
    while not stop.is_set():
        wait = max(0.0, due[0][0] - time.monotonic()) if due else 0.2
        try:
            item = inbox.get(timeout=wait)
            if item is None:
                return
            heapq.heappush(due, (time.monotonic() + float(item["seconds"]), item["id"]))
            continue
        except queue.Empty:
            pass
        now = time.monotonic()
        while due and due[0][0] <= now:
            _, ident = heapq.heappop(due)
            out.write(f"{ident}\n".encode())


class EngineCoreClient:
    """The API server's end of the pipes: step() sends one step and waits for the EngineCore's answer;
    EngineDead once the EngineCore has closed its end (it died)."""

    def __init__(self, steps_fd: int, done_fd: int) -> None:
        self._out = os.fdopen(steps_fd, "wb", buffering=0)
        self._lock = threading.Lock()
        self._waiting: dict = {}
        self._gone = False
        threading.Thread(target=self._receive, args=(done_fd,), daemon=True).start()

    def _receive(self, done_fd: int) -> None:
        with os.fdopen(done_fd, "rb") as f:
            for line in f:
                with self._lock:
                    box = self._waiting.pop(int(line), None)
                if box is not None:
                    box[0].set()
        with self._lock:
            self._gone = True
            for box in self._waiting.values():
                box[1] = True  # never answered: the engine died under it
                box[0].set()
            self._waiting.clear()

    def step(self, seconds: float) -> None:
        box = [threading.Event(), False]
        with self._lock:
            if self._gone:
                raise EngineDead
            ident = id(box)
            self._waiting[ident] = box
            try:
                self._out.write((json.dumps({"id": ident, "seconds": seconds}) + "\n").encode())
            except OSError:
                raise EngineDead from None
        box[0].wait()  # as long as the EngineCore takes: forever while it is stopped
        if box[1]:
            raise EngineDead
