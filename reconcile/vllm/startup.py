"""vLLM's start-up phases, read from the lines its log prints (0.26: the V1 engine's messages), for the
progress `reconcile apply` shows while it waits for /health. Pure: lines in, a phase out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# (pattern, what to show); the last line that matches names the phase. Groups fill the text in.
PHASES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"Initializing a V1 LLM engine"), "starting the engine"),
    # the V1 model runner, and the V2 runner 0.26 takes for the architectures it supports (Llama)
    (re.compile(r"Starting to load model|Loading model from scratch"), "loading weights"),
    (re.compile(r"Loading weights took ([\d.]+) seconds"), "weights loaded in {0}s"),
    (re.compile(r"Model loading took ([\d.]+) GiB"), "model loaded ({0} GiB)"),
    (
        re.compile(r"Dynamo bytecode transform time|Compiling a graph|torch\.compile"),
        "compiling (torch.compile)",
    ),
    (re.compile(r"Available KV cache memory: ([\d.]+) GiB"), "profiling memory: {0} GiB for the KV cache"),
    (re.compile(r"GPU KV cache size: ([\d,]+) tokens"), "KV cache {0} tokens"),
    (re.compile(r"Capturing CUDA graphs"), "capturing CUDA graphs"),
    (re.compile(r"Graph capturing finished in (\d+) secs"), "CUDA graphs captured in {0}s"),
    (re.compile(r"Starting vLLM API server"), "starting the API server"),
    (re.compile(r"Application startup complete"), "ready"),
)
_KV = re.compile(r"GPU KV cache size: ([\d,]+) tokens")


def startup_phase(lines: Sequence[str]) -> tuple[str | None, str | None]:
    """(the phase the last recognised line names, the KV cache size in tokens once printed)."""
    phase: str | None = None
    kv: str | None = None
    for line in lines:
        if m := _KV.search(line):
            kv = m.group(1)
        for pattern, text in PHASES:
            if m := pattern.search(line):
                phase = text.format(*m.groups())
    return phase, kv
