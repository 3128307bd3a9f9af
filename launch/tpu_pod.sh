#!/usr/bin/env bash
# Trains on a Cloud TPU VM pod slice: one process per TPU host, all started at once.
#
#   launch/tpu_pod.sh NAME ZONE --config configs/grapheme.py:kaggle \
#       --data /data/bengaliai-cv19 --workdir gs://BUCKET/grapheme-kaggle
#
# 1. packs this checkout (without .venv, data, workdirs) and copies it to every worker;
# 2. installs the pinned requirements there with jax's TPU build, plus gcsfs for gs:// paths;
# 3. runs `python -m launch.train ARGS` on every worker with BENGRAPHEME_DISTRIBUTED=auto:
#    jax.distributed then finds the pod's hosts itself (bengrapheme/parallel.py).
#
# The workdir must be a gs:// path all workers write to (each host writes its own shards of
# every checkpoint). --data must exist at the same path on every worker (a local copy or a
# gcsfuse mount); the prepared copy of it goes to CACHE_DIR on each worker's local disk,
# because it is read through a memory map.
#
# Environment:
#   DRY_RUN=1        print the commands instead of running them
#   SKIP_SETUP=1     skip steps 1-2 (rerunning on a pod already set up)
#   PROJECT=P        gcloud --project
#   PYTHON=python3   the workers' Python (3.11 or newer, as requirements.txt pins)
#   CACHE_DIR=/tmp/bengrapheme-prepared
set -euo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 NAME ZONE launch.train-args..." >&2
  exit 2
fi
NAME=$1 ZONE=$2
shift 2
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
CACHE_DIR=${CACHE_DIR:-/tmp/bengrapheme-prepared}
JAX_VERSION=$(sed -n 's/^jax==//p' "$ROOT/requirements.txt")
TARBALL=${TMPDIR:-/tmp}/bengrapheme-code.tgz
GCLOUD=(gcloud compute tpus tpu-vm)
WHERE=(--zone "$ZONE" --worker=all ${PROJECT:+--project "$PROJECT"})

run() {  # prints the exact command (shell-quoted) under DRY_RUN, else runs it
  if [[ -n "${DRY_RUN:-}" ]]; then
    local words=() a
    for a in "$@"; do
      if [[ $a =~ ^[][A-Za-z0-9_./:=@,+-]+$ ]]; then words+=("$a"); else words+=("${a@Q}"); fi
    done
    echo "${words[*]}"
  else
    "$@"
  fi
}

if [[ -z "${SKIP_SETUP:-}" ]]; then
  run tar czf "$TARBALL" -C "$ROOT" --exclude=./.venv --exclude=./data --exclude=./workdirs \
    --exclude=.git --exclude=__pycache__ .
  run "${GCLOUD[@]}" scp "$TARBALL" "$NAME:bengrapheme-code.tgz" "${WHERE[@]}"
  run "${GCLOUD[@]}" ssh "$NAME" "${WHERE[@]}" --command "set -e; mkdir -p bengrapheme; \
tar xzf bengrapheme-code.tgz -C bengrapheme; cd bengrapheme; \
[ -x .venv/bin/python ] || $PYTHON -m venv .venv; \
.venv/bin/pip install -q -r requirements.txt 'jax[tpu]==$JAX_VERSION' gcsfs"
fi

# Quoted once more for the remote shell, so arguments with spaces arrive intact.
ARGS=$(printf ' %q' "$@")
run "${GCLOUD[@]}" ssh "$NAME" "${WHERE[@]}" --command "cd bengrapheme && \
BENGRAPHEME_DISTRIBUTED=auto .venv/bin/python -m launch.train$ARGS \
--config.data.cache_dir=$CACHE_DIR"
