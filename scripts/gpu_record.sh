#!/usr/bin/env bash
# Record on the offline GPU host in three passes that each fit one 10-minute device call
# (see book/reproducing.md). Usage on the host:
#   ATTN_GYM_LITE_GIT_COMMIT=<sha> PASS=A|B|D|C|S bash scripts/gpu_record.sh
# A: schedulers, hello-world, pitfalls, training-loop, profiling on the GPU (cores 0-7), and the
#    CPU-only packing-study beside them (cores 8-15);
# B: end-to-end, masking;
# D: buckets, linear-attention;
# C: the GPU tests (every `gpu`-marked test, then the kernel and property tests unfiltered, on the
#    GPU), then notebooks in GPU mode (NOTEBOOKS, default: all, in order);
# S: scale-out, on a host with two GPUs (NVLink multicast off in every process).
# Everything lands in $OUT as one tarball (results) and one log, within the device's file limits.
# Back in the checkout: tar -xzf results_<PASS>.tar.gz -C attn_gym_lite/results/h200 (the package's
# recordings, shipped as package data).
set -uo pipefail
bash scripts/gpu_host_install.sh || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 ATTN_GYM_LITE_CACHE=/tmp/agl-cache
OUT=${OUT:-/tmp/out}; REC=/tmp/rec; mkdir -p "$OUT" "$REC"
log="$OUT/pass_${PASS}.log"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$log"
record() {  # record SUITE LIMIT_S [taskset cores]
  local start=$SECONDS
  timeout "$2" ${3:+taskset -c $3} python3 -m attn_gym_lite.bench "$1" --out "$REC" 2>&1 | tail -5 | tee -a "$log"
  echo "$1: rc ${PIPESTATUS[0]}, $((SECONDS - start)) s" | tee -a "$log"
}
case "$PASS" in
  A)
    record packing-study 420 8-15 &
    record schedulers 450 0-7
    record hello-world 60 0-7
    record pitfalls 120 0-7
    record training-loop 120 0-7
    record profiling 150 0-7
    wait ;;
  B)
    record end-to-end 430
    record masking 90 ;;
  D)
    record buckets 150
    record linear-attention 330 ;;  # the suite keeps its own parts within 270 s (SUITE_BUDGET_S)
  S)
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    record scale-out 480 ;;  # three launches of at most 150 + 150 + 90 s, plus stopping a hung one
  C)
    start=$SECONDS
    timeout 200 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests 2>&1 | tail -25 | tee -a "$log"
    timeout 150 python3 -m pytest -q -rs -p no:cacheprovider tests/test_kernels.py tests/test_properties.py 2>&1 | tail -8 | tee -a "$log"
    echo "tests: $((SECONDS - start)) s" | tee -a "$log"
    for nb in ${NOTEBOOKS:-notebooks/*.ipynb}; do
      start=$SECONDS
      timeout ${NOTEBOOK_LIMIT_S:-240} python3 -m pytest -q -p no:cacheprovider --nbmake --overwrite "$nb" 2>&1 | tail -4 | tee -a "$log"
      echo "$nb: $((SECONDS - start)) s" | tee -a "$log"
    done
    python3 - <<'PY' >> "$log"
import json, glob
for path in sorted(glob.glob("notebooks/*.ipynb")):
    for cell in json.load(open(path))["cells"]:
        for out in cell.get("outputs", []):
            text = "".join(out.get("text", "")) if out.get("output_type") == "stream" else ""
            if text.strip():
                print(f"--- {path}\n{text.strip()[:2500]}")
PY
    ;;
esac
tar -czf "$OUT/results_${PASS}.tar.gz" -C "$REC" . 2>/dev/null
ls -la "$REC" | tee -a "$log"
