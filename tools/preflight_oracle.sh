#!/usr/bin/env bash
# Issue 14's oracle on the offline GPU lab machine (shared/gpu-lab/README.md): vLLM 0.26.0's own
# config/KV-cache code on the corpus (tools/preflight_oracle.py), or with --serve real `vllm serve` on
# tiny models (tools/preflight_serve_check.py). Needs the wheelhouse unpacked in /tmp/wheelhouse
# (gpu-lab/stage.sh unpack). Results: $OUT/preflight-oracle.{json,md}, $OUT/preflight-serve.{json,md};
# finished models are kept in $ORACLE_STATE (default /tmp/preflight-oracle) and not redone.
# usage: tools/preflight_oracle.sh [--serve] [model names...]
set -u
cd "$(dirname "$0")/.."
SITE=${ORACLE_SITE:-/tmp/oracle-site}
if [ ! -d "$SITE/vllm" ]; then
  # vLLM and its runtime wheels beside the image's torch, in a --target dir (numba pin: --no-deps).
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" /tmp/wheelhouse/*.whl || exit 1
fi
export PYTHONPATH="$SITE" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 \
  DO_NOT_TRACK=1 VLLM_HOST_IP=127.0.0.1 VLLM_USE_FLASHINFER_SAMPLER=0
if [ "${1:-}" = "--serve" ]; then
  shift
  exec python3 tools/preflight_serve_check.py "$@"
fi
exec python3 tools/preflight_oracle.py "$@"
