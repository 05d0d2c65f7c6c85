#!/usr/bin/env bash
# Confirm tpaudit's prediction for a full-size real model on a GPU machine, in one command, offline:
# Qwen3-VL-30B-A3B-Instruct (62 GB) is loaded from a checkpoint with its real safetensors headers and zero data
# (--zero-weights: sparse files, nothing downloaded).
#   1. tp 1 on CUDA (one GPU with >= 64 GB, e.g. H100 80GB / H200)
#   2. tp 4 on CPU/gloo, if the machine has >= 96 GB of RAM (each rank holds ~16 GB)
# Prints a short summary; exit 0 when every run that ran matched the prediction.
#   scripts/gpu-verify.sh            (from the repository root, with tpaudit installed)
set -uo pipefail
cd "$(dirname "$0")/.."
model=${TPAUDIT_GPU_VERIFY_MODEL:-fixtures/qwen3-vl-30b-a3b-instruct.snapshot.json.gz}
out=${TPAUDIT_GPU_VERIFY_OUT:-$(mktemp -d)}
status=0
summary=()

run() {  # run NAME ARGS...
  local name=$1; shift
  local t0=$SECONDS
  timeout 540 tpaudit verify "$model" --zero-weights --format json -o "$out/$name.json" "$@" 2> "$out/$name.err"
  local rc=$?
  local took=$((SECONDS - t0))
  case $rc in
    0) summary+=("$name: MATCH in ${took}s: $(python3 -c "import json; d=json.load(open('$out/$name.json')); print(', '.join(f\"rank {r['rank']} {r['measured_param_bytes']:,} B (allocated {r['allocated_bytes']:,} B)\" for r in d['ranks']))")");;
    1) summary+=("$name: MISMATCH in ${took}s (see $out/$name.json)"); status=1;;
    3) summary+=("$name: load failed in ${took}s: $(tail -n 1 "$out/$name.err")"); status=1;;
    124) summary+=("$name: timed out after ${took}s"); status=1;;
    *) summary+=("$name: could not run (exit $rc): $(tail -n 1 "$out/$name.err")"); status=1;;
  esac
}

if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  run tp1-cuda --tp 1 --device cuda
else
  summary+=("tp1-cuda: skipped (no CUDA device)")
fi
ram_gb=$(awk '/MemTotal/ {print int($2 / 1000000)}' /proc/meminfo)
if [ "${ram_gb:-0}" -ge 96 ]; then
  run tp4-cpu --tp 4 --device cpu
else
  summary+=("tp4-cpu: skipped (${ram_gb} GB of RAM < 96 GB)")
fi
printf '%s\n' "tpaudit gpu-verify: $model" "${summary[@]}" "details: $out"
exit $status
