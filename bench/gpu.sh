#!/usr/bin/env bash
# Training images/s and MFU of both tasks' full configs (bf16) on a GPU, in under 8 minutes.
#
#   bash bench/gpu.sh                    # venv .venv-gpu + jax[cuda12] at the pinned version
#   PYTHON=python3 bash bench/gpu.sh     # an interpreter that already has a CUDA jax and
#                                        # the project's requirements (no install)
#
# Prints a table (task, step ms, images/s, TFLOP/s, MFU) and writes gpu_throughput.json to
# $OUT when set, else to bench/. Extra arguments go to bench/gpu_throughput.py (--steps,
# --tasks grapheme fragments). The CPU check of the Python part:
#   .venv/bin/python -m bench.gpu_throughput --cpu-smoke
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
JAX_VERSION=$(sed -n 's/^jax==//p' requirements.txt)

if [ -z "${PYTHON:-}" ]; then
  VENV=${VENV:-.venv-gpu}
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  # The CUDA build of the very jax the project pins: the same jaxlib plus the CUDA plugin.
  "$VENV/bin/pip" install -q --disable-pip-version-check -r requirements.txt \
    "jax[cuda12]==$JAX_VERSION"
  PYTHON=$VENV/bin/python
  echo "installed jax[cuda12]==$JAX_VERSION in $VENV ($((SECONDS - start)) s)"
fi

"$PYTHON" - <<'PY'
import jax
if jax.default_backend() != 'gpu':
  raise SystemExit(f'jax {jax.__version__} sees no GPU (backend {jax.default_backend()}): '
                   'check the driver, or install the CUDA build')
print(f'jax {jax.__version__}:', ', '.join(d.device_kind for d in jax.devices()))
PY

out_dir=${OUT:-bench}
# What is left of the 8 minutes goes to the measurements; compiling dominates.
left=$((470 - (SECONDS - start)))
if [ "$left" -lt 120 ]; then
  echo "only ${left}s of the 8 minutes left after the install: run again (the venv is kept)" >&2
  exit 1
fi
PYTHONUNBUFFERED=1 timeout "$left" "$PYTHON" -m bench.gpu_throughput \
  --out "$out_dir/gpu_throughput.json" "$@"
echo "total $((SECONDS - start)) s"
