#!/usr/bin/env bash
# Issue 8's end-to-end run on an offline GPU lab machine (shared/gpu-lab/README.md), repeatable.
# Needs: the vLLM 0.26.0 wheelhouse unpacked in /tmp/wheelhouse (gpu-lab/stage.sh), reconcile's
# own extra wheels (tomlkit, deepdiff, orderly-set, tenacity, uv; see README "GPU lab") in
# $RECONCILE_WHEELS (default .whl/), and gpu-lab/make_tiny_model.py ($TINY_MODEL_SCRIPT).
# usage: [GPU_LAB_TESTS='tests/x.py ...'] tools/gpu_lab.sh [extra pytest args]
#        figures land in $OUT/gpu-lab*.json when $OUT is set
set -u
cd "$(dirname "$0")/.."
WHEELS=${RECONCILE_WHEELS:-.whl}
# Not under /tmp: reconcile judges its own environment, and a world-writable dir is left out of it.
SITE=${RECONCILE_SITE:-/opt/reconcile-lab/site}
TINY=${TINY_MODEL_SCRIPT:-../shared/gpu-lab/make_tiny_model.py}
# reconcile's own dependencies beside the image's python3, in a --target dir that only reconcile's
# interpreter puts on sys.path (never PYTHONPATH: the venv and vLLM must not see it).
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" \
  /tmp/wheelhouse/pydantic-2*.whl /tmp/wheelhouse/pydantic_core-*.whl \
  /tmp/wheelhouse/annotated_types-*.whl /tmp/wheelhouse/typing_inspection-*.whl "$WHEELS"/*.whl || exit 1
# Byte-compiled, as a pip install leaves a user's reconcile: the lab image sets PYTHONDONTWRITEBYTECODE,
# so without this every CLI run compiled reconcile and pydantic again (0.5 s of a rollback; issue 26).
python3 -m compileall -q "$SITE" reconcile probes actions >/dev/null || exit 1
mkdir -p /opt/reconcile-lab
# The spec's [venv] wheelhouse: root installs from it, so not in /tmp (the path rule refuses that).
[ -d /opt/reconcile-lab/wheelhouse ] || cp -a /tmp/wheelhouse /opt/reconcile-lab/wheelhouse || exit 1
[ -f /opt/reconcile-lab/tiny-llama-src/config.json ] || python3 "$TINY" /opt/reconcile-lab/tiny-llama-src >/dev/null || exit 1
export RECONCILE_GPU_LAB=1 RECONCILE_SITE="$SITE" PYTHONUNBUFFERED=1
# GPU_LAB_TESTS picks the test files (default: issue 8's run); e.g. tests/test_gpu_lab_ownership.py
TESTS=${GPU_LAB_TESTS:-tests/test_gpu_lab.py}
exec python3 -c "import sys; sys.path[:0] = ['$SITE', '.']; import pytest; sys.exit(pytest.main(['-p', 'no:cacheprovider', '-m', 'gpu', '-v', '-s', *'$TESTS'.split(), *sys.argv[1:]]))" "$@"
