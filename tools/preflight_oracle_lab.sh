#!/usr/bin/env bash
# Issue 14's oracle re-run on one H200 lab machine in two device calls of < 10 minutes, after the
# wheelhouse parts were staged in /tmp/stage (one call per part: shared/gpu-lab/stage.sh add).
#   call 1: the config oracle (29 rows, 8 jobs) and the serve cases mla, mamba-hybrid-pc (~5.5 min)
#   call 2: the other 7 serve cases (~8 min); both share ORACLE_STATE, so a timed-out call resumes.
#   28a, 28b: issue 28's cases (--kv-cache-memory-bytes verdicts; Cohere2, Llama 4, Granite-4.0-H,
#   NemotronH's padded groups, Zamba2), ~5 and ~4 min.
#   28c, 28d: one served row for each family of architectures none had checked (tools/vllm_architectures.py
#   --families), most informative first, in two calls: 28c's four hybrids took 540 s on 2026-12-02 03:56,
#   28d's eight 501 s at 07:12 (each case 50-161 s); a timed-out call keeps its rows.
# usage: OUT=dir tools/preflight_oracle_lab.sh 1|2      results: $OUT/preflight-{oracle,serve}.{json,md}
set -u
cd "$(dirname "$0")/.."
: "${OUT:?OUT must name the results dir}"
export ORACLE_STATE=${ORACLE_STATE:-/tmp/preflight-oracle-lab} ORACLE_JOBS=${ORACLE_JOBS:-8}
if [ ! -d /tmp/wheelhouse ]; then  # as stage.sh unpack does
  cp -n .wh/wheelhouse.* /tmp/stage/ 2>/dev/null
  cat /tmp/stage/wheelhouse.part.* > /tmp/wheelhouse.tar || exit 3
  (cd /tmp && sed 's/ .*/  wheelhouse.tar/' /tmp/stage/wheelhouse.sha256 | sha256sum -c -) || exit 3
  mkdir -p /tmp/wheelhouse && tar xf /tmp/wheelhouse.tar -C /tmp/wheelhouse || exit 3
fi
case "${1:-}" in
  1) timeout 330 tools/preflight_oracle.sh > "$OUT/oracle.log" 2>&1; echo "oracle rc=$?"
     timeout 240 tools/preflight_oracle.sh --serve mla mamba-hybrid-pc > "$OUT/serve.log" 2>&1 ;;
  2) timeout 540 tools/preflight_oracle.sh --serve dense moe sliding interleaved mamba-hybrid dense-nofit \
       sliding-fits > "$OUT/serve.log" 2>&1 ;;
  # Issue 28: the budget-flag verdicts and the families the corpus never served, in two calls.
  28a) timeout 560 tools/preflight_oracle.sh --serve dense-kvbytes-nofit dense-kvbytes-fits mamba-kvbytes-graphs \
         cohere2 llama4-text > "$OUT/serve.log" 2>&1 ;;
  28b) timeout 560 tools/preflight_oracle.sh --serve granite-h nemotronh-pad zamba2 > "$OUT/serve.log" 2>&1 ;;
  28c) timeout 560 tools/preflight_oracle.sh --serve falcon-h1 qwen3-next jamba minicpm3 > "$OUT/serve.log" 2>&1 ;;
  28d) timeout 560 tools/preflight_oracle.sh --serve glm4-moe-lite cohere2-moe phimoe qwen3-sliding \
         gptbigcode-tf qwen2-heads gpt2 qwen2-moe > "$OUT/serve.log" 2>&1 ;;
  *) echo "usage: OUT=dir tools/preflight_oracle_lab.sh 1|2|28a|28b|28c|28d" >&2; exit 2 ;;
esac
echo "serve rc=$?"
cat "$OUT"/preflight-oracle.md "$OUT"/preflight-serve.md 2>/dev/null
