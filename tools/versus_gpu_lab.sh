#!/usr/bin/env bash
# benchmarks/versus.py on the offline GPU lab machine (shared/gpu-lab/README.md): two
# commits' `reconcile plan` of the GPU specs (real NVML and nvcc), byte for byte, and their warm time.
# Here (with the package index):  tools/versus_gpu_lab.sh wheels BASE_REF
#   -> .lab/rw (reconcile's dependencies for the lab's Python 3.12), .lab/rw-base, .lab/rw-new
# There (a device call carrying .lab and .whl):  tools/versus_gpu_lab.sh run
#   -> the comparisons and the timing on stdout and in $OUT/versus-gpu-lab.txt
# No vLLM, wheelhouse or model is needed: the specs plan with drift where those are absent.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
wheels)
  base=${2:?usage: tools/versus_gpu_lab.sh wheels BASE_REF}
  rm -rf .lab/rw .lab/rw-base .lab/rw-new && mkdir -p .lab/rw .lab/rw-base .lab/rw-new
  pip=(.venv/bin/pip)
  "${pip[@]}" download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .lab/rw \
    "pydantic==$(.venv/bin/python -c 'import pydantic; print(pydantic.VERSION)')" \
    "pydantic-core==$(.venv/bin/python -c 'import pydantic_core; print(pydantic_core.__version__)')" \
    annotated-types typing-inspection typing-extensions packaging tomlkit deepdiff orderly-set tenacity
  tree=$(mktemp -d) && git archive "$base" | tar -x -C "$tree"
  "${pip[@]}" wheel -q --no-deps -w .lab/rw-base "$tree" && rm -rf "$tree"
  "${pip[@]}" wheel -q --no-deps -w .lab/rw-new .
  ls .lab/rw .lab/rw-base .lab/rw-new
  ;;
run)
  out=${OUT:-/tmp/out} && mkdir -p "$out"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  for v in base new; do
    python3 -m venv "/tmp/v-$v"
    site=$(echo /tmp/v-$v/lib/python3.*/site-packages)
    # the lab's python3 is itself the torch venv: its packages (psutil, pynvml, huggingface_hub)
    # reach a new venv only through a .pth file
    echo /opt/torch/.venv/lib/python3.12/site-packages > "$site/torch-env.pth"
    "/tmp/v-$v/bin/pip" install -q --no-index --no-deps .lab/rw/*.whl .lab/rw-$v/reconcile-*.whl
  done
  python3 benchmarks/versus.py --installed /tmp/v-base/bin/reconcile /tmp/v-new/bin/reconcile \
    --spec specs/h200-lab.toml --spec specs/blackwell-2x5090.toml --rounds 15 2>&1 | tee "$out/versus-gpu-lab.txt"
  ;;
*) echo "usage: tools/versus_gpu_lab.sh wheels BASE_REF | run" >&2; exit 2 ;;
esac
