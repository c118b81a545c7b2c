#!/usr/bin/env bash
# On the offline GPU lab (wheelhouse unpacked in /tmp/wheelhouse, shared/gpu-lab/stage.sh): real vLLM
# 0.26.0 serves a tiny random model (shared/gpu-lab/make_tiny_model.py, copied to .lab/), answers three
# chats, and its /metrics page is saved as OUTDIR/vllm-0.26.0-metrics.txt: the capture that
# tests/fixtures/vllm-metrics/ keeps for probes.metrics' tests.
# usage: tools/capture_vllm_metrics.sh OUTDIR
set -u
out=${1:?usage: tools/capture_vllm_metrics.sh OUTDIR}
SITE=${ORACLE_SITE:-/tmp/oracle-site}
[ -d "$SITE/vllm" ] || python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" /tmp/wheelhouse/*.whl || exit 1
export PYTHONPATH="$SITE" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 \
  DO_NOT_TRACK=1 VLLM_HOST_IP=127.0.0.1 VLLM_USE_FLASHINFER_SAMPLER=0
python3 .lab/make_tiny_model.py /tmp/tiny-metrics > /dev/null || exit 1
python3 -m vllm.entrypoints.cli.main serve /tmp/tiny-metrics --port 8011 --enforce-eager --served-model-name tiny \
  --max-model-len 512 --gpu-memory-utilization 0.2 > "$out/vllm-serve.log" 2>&1 &
pid=$!
python3 - <<'PY'
import json, time, urllib.request
base = "http://127.0.0.1:8011"
for _ in range(180):
    try:
        if urllib.request.urlopen(base + "/health", timeout=2).status == 200:
            break
    except OSError:
        time.sleep(1)
body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}).encode()
for _ in range(3):
    req = urllib.request.Request(base + "/v1/chat/completions", body, {"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=60).read()
PY
python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:8011/metrics', timeout=10).read().decode())" \
  > "$out/vllm-0.26.0-metrics.txt"
kill -TERM "$pid"; wait "$pid"
wc -l "$out/vllm-0.26.0-metrics.txt"
