#!/usr/bin/env bash
# Record on the offline GPU host in passes that each fit one 10-minute device call (see
# book/reproducing.md). Usage on the host (PASS may name several passes, run in that order):
#   ATTN_GYM_LITE_GIT_COMMIT=<sha> PASS=A bash scripts/gpu_record.sh
# A: schedulers, hello-world, pitfalls, training-loop, profiling, masking on the GPU (cores 0-7),
#    and the CPU-only packing-study beside them (cores 8-15);
# L: linear-attention (alone: it needs most of a call);
# B: end-to-end, buckets;
# C: the GPU tests (every `gpu`-marked test, then the kernel and property tests unfiltered, on the
#    GPU, with the malformed-layout tests) and, at the same time, the notebooks in GPU mode, NOTEBOOK_LANES at once (correctness
#    and live demonstrations only: nothing of C is a recording, so sharing the GPU is harmless);
#    UNFILTERED=0 leaves out the unfiltered kernel and property tests (when the kernels are unchanged
#    since their last GPU run);
# S: scale-out, on a host with two GPUs (NVLink multicast off in every process);
# X: explorations, not recordings: scripts/explore_hopper_forward.py, then scripts/explore_kda.py
#    where the tree has it, EXPLORE_S seconds each.
# Everything lands in $OUT: one tarball of recordings per pass, re-made after every suite so that a
# call killed at its limit still returns what finished, and one log per pass.
# Back in the checkout: tar -xzf results_<PASS>.tar.gz -C attn_gym_lite/results/h200 (the package's
# recordings, shipped as package data).
set -uo pipefail
bash scripts/gpu_host_install.sh || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 ATTN_GYM_LITE_CACHE=/tmp/agl-cache
OUT=${OUT:-/tmp/out}
record() {  # record SUITE LIMIT_S [taskset cores]
  local start=$SECONDS
  timeout "$2" ${3:+taskset -c $3} python3 -m attn_gym_lite.bench "$1" --out "$REC" 2>&1 | tail -5 | tee -a "$log"
  echo "$1: rc ${PIPESTATUS[0]}, $((SECONDS - start)) s" | tee -a "$log"
  tar -czf "$OUT/results_${pass}.tar.gz" -C "$REC" . 2>/dev/null
}
notebook() {  # notebook PATH: run it in GPU mode under nbmake, its log beside the others
  local start=$SECONDS name; name=$(basename "$1" .ipynb)
  timeout "${NOTEBOOK_LIMIT_S:-300}" python3 -m pytest -q -p no:cacheprovider --nbmake --overwrite "$1" \
    > "/tmp/nb_$name.log" 2>&1
  echo "$1: rc $?, $((SECONDS - start)) s" >> "/tmp/nb_$name.log"
}
export -f notebook
for pass in ${PASS}; do
  REC=/tmp/rec_$pass; mkdir -p "$OUT" "$REC"
  log="$OUT/pass_${pass}.log"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$log"
  case "$pass" in
    A)
      record packing-study 420 8-15 &
      record schedulers 450 0-7
      record hello-world 60 0-7
      record pitfalls 120 0-7
      record training-loop 120 0-7
      record profiling 150 0-7
      record masking 90 0-7
      wait ;;
    L)
      # Alone in its call: the suite keeps its parts within 540 s (SUITE_BUDGET_S), or within
      # ATTN_GYM_LITE_LA_BUDGET_S when set (a call with less device time left), and is killed 40 s after.
      if [ -n "${ATTN_GYM_LITE_LA_BUDGET_S:-}" ]; then
        record linear-attention $(( ${ATTN_GYM_LITE_LA_BUDGET_S%.*} + 40 ))
      else
        record linear-attention 580
      fi ;;
    B)
      record end-to-end 430
      record buckets 150 ;;
    S)
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      record scale-out 480 ;;  # three launches of at most 150 + 150 + 90 s, plus stopping a hung one
    C)
      start=$SECONDS
      # --timeout (pytest-timeout, on the host): one hung test fails alone instead of ending the run.
      # Two test lanes beside the notebooks: at 64da1b9 the `gpu` tests alone needed more than 240 s
      # with the notebooks sharing the GPU (cut at 75%), so they no longer wait for each other.
      timeout 380 python3 -m pytest -q -rfEs -p no:cacheprovider --timeout=90 -m gpu tests > /tmp/tests_gpu.log 2>&1 &
      if [ "${UNFILTERED:-1}" = 1 ]; then
        timeout 300 python3 -m pytest -q -rs -p no:cacheprovider tests/test_kernels.py tests/test_properties.py tests/test_malformed_layouts.py \
          > /tmp/tests_unfiltered.log 2>&1 &
      else echo "unfiltered kernel and property tests not run (UNFILTERED=0)" > /tmp/tests_unfiltered.log; fi
      # Heaviest first, so that the lanes finish together.
      ls ${NOTEBOOKS:-notebooks/04*.ipynb notebooks/09*.ipynb notebooks/08*.ipynb notebooks/06*.ipynb \
        notebooks/02*.ipynb notebooks/05*.ipynb notebooks/03*.ipynb notebooks/07*.ipynb notebooks/01*.ipynb \
        notebooks/10*.ipynb} | xargs -P "${NOTEBOOK_LANES:-3}" -I{} bash -c 'notebook {}'
      wait
      tail -25 /tmp/tests_gpu.log | tee -a "$log"; tail -8 /tmp/tests_unfiltered.log | tee -a "$log"
      for f in /tmp/nb_*.log; do tail -5 "$f"; done | tee -a "$log"
      echo "pass C: $((SECONDS - start)) s" | tee -a "$log"
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
    X)
      timeout $(( ${EXPLORE_S:-100} + 30 )) python3 scripts/explore_hopper_forward.py "${EXPLORE_S:-100}" \
        > "$OUT/explore_forward.log" 2>&1
      echo "explore forward: rc $?" | tee -a "$log"; tail -30 "$OUT/explore_forward.log" | tee -a "$log"
      if [ -f scripts/explore_kda.py ]; then  # on the branches with the KDA speed work
        timeout $(( ${EXPLORE_S:-100} + 30 )) python3 scripts/explore_kda.py --budget "${EXPLORE_S:-100}" \
          > "$OUT/explore_kda.log" 2>&1
        echo "explore kda: rc $?" | tee -a "$log"; tail -30 "$OUT/explore_kda.log" | tee -a "$log"
      fi ;;
    *) echo "unknown pass $pass (A, L, B, C, S or X)" | tee -a "$log"; exit 2 ;;
  esac
  ls -la "$REC" | tee -a "$log"
done
