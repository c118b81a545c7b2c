"""The fake `vllm bench serve`: real load over HTTP (threads, one request a stream), vLLM 0.26's flags
that reconcile uses, its printed summary and its result JSON (benchmarks/serve.py's field names).

Imported by tests/fakes/vllm. Stdlib only. The key comes from OPENAI_API_KEY, as the real one reads it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import sys
import threading
import time
import urllib.parse
from datetime import datetime

OPENAI_COMPATIBLE = ("openai", "vllm", "openai-chat")
VOCAB = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    bench = subparsers.add_parser("bench", usage="vllm bench <bench_type> [options]")
    kinds = bench.add_subparsers(dest="bench_type")
    p = kinds.add_parser("serve", usage="vllm bench serve [options]")
    p.add_argument("--backend", default="openai", choices=["openai", "vllm", "openai-chat"])
    p.add_argument("--base-url", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--endpoint", default="/v1/completions")
    p.add_argument("--model", default=None)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--label", default=None)
    p.add_argument("--dataset-name", default="random", choices=["random"])
    p.add_argument("--random-input-len", type=int, default=1024)
    p.add_argument("--random-output-len", type=int, default=128)
    p.add_argument("--random-range-ratio", type=float, default=0.0)
    p.add_argument("--input-len", type=int, default=None)
    p.add_argument("--output-len", type=int, default=None)
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--request-rate", type=float, default=float("inf"))
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--disable-tqdm", action="store_true")
    p.add_argument("--save-result", action="store_true")
    p.add_argument("--save-detailed", action="store_true")
    p.add_argument("--result-dir", default=None)
    p.add_argument("--result-filename", default=None)
    p.add_argument("--percentile-metrics", default=None)
    p.add_argument("--metric-percentiles", default="99")
    p.add_argument("--ready-check-timeout-sec", type=int, default=0)


class Output:
    def __init__(self, prompt_len: int) -> None:
        self.prompt_len, self.success, self.error = prompt_len, False, ""
        self.ttft, self.latency, self.itl, self.output_tokens, self.text = 0.0, 0.0, [], 0, ""
        self.start_time = 0.0


def request(
    args: argparse.Namespace, url: urllib.parse.SplitResult, model: str, prompt: str, out: Output
) -> None:
    """One streamed request, timed as vLLM's endpoint_request_func times it."""
    chat = args.backend == "openai-chat"
    body: dict = {"model": model, "stream": True, "stream_options": {"include_usage": True}}
    if chat:
        body.update(
            messages=[{"role": "user", "content": prompt}], max_completion_tokens=args.random_output_len
        )
    else:
        body.update(prompt=prompt, max_tokens=args.random_output_len, repetition_penalty=1.0)
    if args.ignore_eos:
        body["ignore_eos"] = True
    if args.temperature is not None:
        body["temperature"] = args.temperature
    headers = {"Content-Type": "application/json"}
    if os.environ.get("OPENAI_API_KEY"):
        headers["Authorization"] = f"Bearer {os.environ['OPENAI_API_KEY']}"
    st = time.perf_counter()
    out.start_time = st
    last = st
    try:
        conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port or 80, timeout=600)
        conn.request("POST", url.path + args.endpoint, json.dumps(body), headers)
        resp = conn.getresponse()
        if resp.status != 200:
            out.error = resp.reason or str(resp.status)
            resp.read()
            return
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[len(b"data:") :].strip()
            if payload == b"[DONE]":
                continue
            now = time.perf_counter()
            data = json.loads(payload)
            if choices := data.get("choices"):
                text = choices[0]["delta"].get("content") if chat else choices[0].get("text")
                if out.ttft == 0.0:
                    out.ttft = now - st
                else:
                    out.itl.append(now - last)
                out.text += text or ""
                last = now
            elif usage := data.get("usage"):
                out.output_tokens = usage.get("completion_tokens") or 0
        out.latency = last - st
        out.success = True
        conn.close()
    except (OSError, ValueError, http.client.HTTPException) as exc:
        out.error = str(exc)


def stats(values: list, percentiles: list) -> dict:
    """mean/median/std and the percentiles, in ms (numpy's linear percentile)."""
    if not values:
        values = [0.0]
    ordered = sorted(values)

    def pct(p: float) -> float:
        k = (len(ordered) - 1) * p / 100
        lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)

    return {
        "mean": statistics.fmean(values) * 1000,
        "median": statistics.median(values) * 1000,
        "std": statistics.pstdev(values) * 1000,
        "percentiles": [(p, pct(p) * 1000) for p in percentiles],
    }


def run(args: argparse.Namespace) -> int:
    print(args)
    if args.input_len is not None:
        args.random_input_len = args.input_len
    if args.output_len is not None:
        args.random_output_len = args.output_len
    if args.dataset_name == "random" and args.backend in OPENAI_COMPATIBLE:
        args.ignore_eos = True  # vLLM 0.26: random datasets ignore EOS so generation runs to length
    base = args.base_url or f"http://{args.host}:{args.port}"
    url = urllib.parse.urlsplit(base)
    model_id = args.model
    if model_id is None:
        print("Model not specified, fetching first model from server...")
        conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port or 80, timeout=30)
        key = os.environ.get("OPENAI_API_KEY")
        conn.request(
            "GET", url.path + "/v1/models", headers={"Authorization": f"Bearer {key}"} if key else {}
        )
        model_id = json.loads(conn.getresponse().read())["data"][0]["id"]
    model_name = args.served_model_name or model_id
    rng = random.Random(args.seed)
    prompts = [
        " ".join(rng.choice(VOCAB) for _ in range(args.random_input_len)) for _ in range(args.num_prompts)
    ]
    outputs = [Output(args.random_input_len) for _ in prompts]
    limit = threading.Semaphore(args.max_concurrency or len(prompts) or 1)
    done = [0]
    lock = threading.Lock()

    def one(i: int) -> None:
        with limit:
            request(args, url, model_name, prompts[i], outputs[i])
        with lock:
            done[0] += 1
            if not args.disable_tqdm:
                print(f"\r{done[0]}/{len(prompts)}", end="", file=sys.stderr, flush=True)

    print(
        f"Starting main benchmark run...\nTraffic request rate: {args.request_rate}\n"
        f"Maximum request concurrency: {args.max_concurrency}"
    )
    start = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    duration = time.perf_counter() - start
    if not args.disable_tqdm:
        print(file=sys.stderr)
    ok = [o for o in outputs if o.success]
    for o in ok:
        o.output_tokens = o.output_tokens or len(o.text.split())
    total_in = sum(o.prompt_len for o in ok)
    total_out = sum(o.output_tokens for o in ok)
    percentiles = [float(p) for p in args.metric_percentiles.split(",")]
    series = {
        "ttft": [o.ttft for o in ok],
        "tpot": [(o.latency - o.ttft) / (o.output_tokens - 1) for o in ok if o.output_tokens > 1],
        "itl": [x for o in ok for x in o.itl],
        "e2el": [o.latency for o in ok],
    }
    result: dict = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": args.backend,
        "backend": args.backend,
        "label": args.label,
        "model_id": model_id,
        "tokenizer_id": args.tokenizer or model_id,
        "num_prompts": args.num_prompts,
        "request_rate": "inf" if args.request_rate == float("inf") else args.request_rate,
        "burstiness": 1.0,
        "max_concurrency": args.max_concurrency,
        "duration": duration,
        "completed": len(ok),
        "failed": len(outputs) - len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration,
        "request_goodput": None,
        "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
        "max_output_tokens_per_s": total_out / max(duration, 1e-9),
        "max_concurrent_requests": min(args.max_concurrency or len(prompts), len(prompts)),
        "rtfx": 0.0,
    }
    print("{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    print("{:<40} {:<10}".format("Successful requests:", len(ok)))
    print("{:<40} {:<10}".format("Failed requests:", len(outputs) - len(ok)))
    print("{:<40} {:<10.2f}".format("Benchmark duration (s):", duration))
    print("{:<40} {:<10}".format("Total input tokens:", total_in))
    print("{:<40} {:<10}".format("Total generated tokens:", total_out))
    print("{:<40} {:<10.2f}".format("Output token throughput (tok/s):", result["output_throughput"]))
    chosen = (args.percentile_metrics or "ttft,tpot,itl").split(",")
    names = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2EL"}
    for metric in ("ttft", "tpot", "itl", "e2el"):
        if metric not in chosen:
            continue
        s = stats(series[metric], percentiles)
        print("{:<40} {:<10.2f}".format(f"Mean {names[metric]} (ms):", s["mean"]))
        result[f"mean_{metric}_ms"], result[f"median_{metric}_ms"] = s["mean"], s["median"]
        result[f"std_{metric}_ms"] = s["std"]
        for p, value in s["percentiles"]:
            word = str(int(p)) if int(p) == p else str(p)
            result[f"p{word}_{metric}_ms"] = value
    print("=" * 50)
    if args.save_detailed:
        result.update(
            input_lens=[o.prompt_len for o in outputs],
            output_lens=[o.output_tokens for o in outputs],
            ttfts=[o.ttft for o in outputs],
            itls=[o.itl for o in outputs],
            errors=[o.error for o in outputs],
        )
    if args.save_result:
        name = args.result_filename or (
            f"{args.backend}-{args.request_rate}qps-concurrency{args.max_concurrency}-"
            f"{os.path.basename(str(model_id))}-{result['date']}.json"
        )
        if args.result_dir:
            os.makedirs(args.result_dir, exist_ok=True)
            name = os.path.join(args.result_dir, name)
        with open(name, "w", encoding="utf-8") as f:
            json.dump(result, f)
    errors = {o.error for o in outputs if not o.success}
    if errors and not ok:
        print(f"All requests failed: {sorted(errors)[:3]}", file=sys.stderr)
    return 0
