#!/usr/bin/env bash
# Record on the offline GPU host in passes that each fit one 10-minute device call (see
# book/reproducing.md). Usage on the host (PASS may name several passes, run in that order):
#   ATTN_GYM_LITE_GIT_COMMIT=<sha> PASS=A bash scripts/gpu_record.sh
# A: schedulers, hello-world, pitfalls, training-loop, profiling, masking, buckets on the GPU
#    (cores 0-7), and the CPU-only packing-study beside them (cores 8-15); about 380 s on the H200;
# L: linear-attention (alone, at its default budget: on a machine with cold autotune caches its first
#    two parts alone take about 300 s);
# B: end-to-end (E2E_LIMIT_S), end-to-end-large with LARGE=1, then notebook 08 in GPU mode on them;
# G: end-to-end-large alone (about 165 s: with end-to-end and notebook 08 it overruns one call);
# C: the GPU tests and, at the same time, the notebooks in GPU mode, NOTEBOOK_LANES at once
#    (correctness and live demonstrations only: nothing of C is a recording, so sharing the GPU is
#    harmless). Three test lanes: the `gpu`-marked tests without the linear-attention ones; the
#    linear-attention `gpu` tests (slow: each runs a small suite); the kernel, property,
#    malformed-layout and KDA kernel tests unfiltered (on the GPU). UNFILTERED=0 leaves out the
#    last lane (when the kernels are unchanged since their last GPU run). TEST_IDS="a.txt b.txt":
#    instead, one lane per file of test node ids (to finish what an earlier call cut off);
#    NOTEBOOKS=none: no notebooks (they already ran at this code); STOP_ON_FAILURE=1: a failed test
#    ends the call after C, so that PASS="C A" records nothing on code that just failed;
# N: every notebook in GPU mode (NOTEBOOK_LANES at once; NOTEBOOKS to name fewer), no tests, then
#    scripts/sync_prose.py --check against their outputs: the prose values a GPU run prints otherwise
#    (for notebooks whose code is unchanged since C, after a change to their prose; about 280 s);
# T: the notebooks suite (each chapter's GPU-mode run time and peak memory): NOTEBOOKS (default all)
#    one after the other, alone on the GPU; all ten overrun one call, so two calls:
#    NOTEBOOKS="notebooks/0[1-8]*.ipynb notebooks/10*.ipynb", then notebooks/09*.ipynb (pass N's lanes
#    at 956b363 logged 310 s for the nine and 209 s for 09);
# S: scale-out, on a host with two GPUs (NVLink multicast off in every process);
# X: explorations, not recordings: scripts/explore_hopper_forward.py, then scripts/explore_kda.py,
#    EXPLORE_S seconds each; EXPLORE="kda" (or "forward") runs one of them only; EXPLORE="short_conv"
#    runs scripts/explore_short_conv.py (the short-convolution kernels' tiles against the tensor ops);
#    EXPLORE="backward" runs scripts/explore_atomic_backward.py (one pass with atomic dQ against the
#    package's deterministic two-pass backward); "schedules" and "prefetch" scripts/explore_schedules.py
#    without and with --prefetch (each in its own process, as it must be); "kda_options"
#    scripts/explore_kda_split.py (the KDA sub-block kernels' launch options); "backward_ws"
#    scripts/explore_hopper_backward.py (the backward warp-specialized, against the package's).
# Everything lands in $OUT: one tarball of recordings per pass, re-made after every suite so that a
# call killed at its limit still returns what finished, and one tarball of every log of the pass
# (logs_<PASS>.tar.gz: a device call returns a limited number of files, so logs travel together).
# Back in the checkout: tar -xzf results_<PASS>.tar.gz -C attn_gym_lite/results/h200 (the package's
# recordings, shipped as package data).
set -uo pipefail
# Provenance: a recording names the full commit it measured (tests/test_bench.py checks it). At f3e7c20
# a mistyped value went into eight recordings, so a value that is no 40-hex commit stops here.
# (Passes C and X record nothing and need no commit.)
if [[ " ${PASS} " =~ \ [ALBSGT]\  ]] && [[ ! "${ATTN_GYM_LITE_GIT_COMMIT:-}" =~ ^[0-9a-f]{40}$ ]]; then
  echo "ATTN_GYM_LITE_GIT_COMMIT must be the checkout's full commit (git rev-parse HEAD), got '${ATTN_GYM_LITE_GIT_COMMIT:-}'" >&2
  exit 2
fi
bash scripts/gpu_host_install.sh || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 ATTN_GYM_LITE_CACHE=/tmp/agl-cache
OUT=${OUT:-/tmp/out}
export LOGS=${LOGS:-/tmp/logs}; mkdir -p "$LOGS"
pack_logs() { cp "$log" "$LOGS/" 2>/dev/null; tar -czf "$OUT/logs_${pass}.tar.gz" -C "$LOGS" . 2>/dev/null; }
record() {  # record SUITE LIMIT_S [taskset cores]
  local start=$SECONDS
  timeout "$2" ${3:+taskset -c $3} python3 -m attn_gym_lite.bench "$1" --out "$REC" > "$LOGS/suite_$1.log" 2>&1
  local rc=$?
  tail -5 "$LOGS/suite_$1.log" | tee -a "$log"
  echo "$1: rc $rc, $((SECONDS - start)) s" | tee -a "$log"
  # A suite records a failed part under "errors" and still exits 0: say so here, not at ship time.
  local file="$REC/${1//-/_}.json"
  [ -f "$file" ] && python3 -c "import json, sys; e = json.load(open(sys.argv[1])).get('errors')
if e: print(sys.argv[2] + ': PARTS FAILED: ' + ', '.join(e))" "$file" "$1" | tee -a "$log"
  tar -czf "$OUT/results_${pass}.tar.gz" -C "$REC" . 2>/dev/null
  pack_logs
}
notebook() {  # notebook PATH: run it in GPU mode under nbmake, its log beside the others
  local start=$SECONDS name; name=$(basename "$1" .ipynb)
  timeout "${NOTEBOOK_LIMIT_S:-300}" python3 -m pytest -q -p no:cacheprovider --nbmake --overwrite "$1" \
    > "$LOGS/nb_$name.log" 2>&1
  echo "$1: rc $?, $((SECONDS - start)) s" >> "$LOGS/nb_$name.log"
}
export -f notebook
notebooks() {  # NOTEBOOKS (default: all, heaviest first), NOTEBOOK_LANES at once
  ls ${NOTEBOOKS:-notebooks/09*.ipynb notebooks/04*.ipynb notebooks/08*.ipynb notebooks/02*.ipynb notebooks/06*.ipynb \
    notebooks/10*.ipynb notebooks/05*.ipynb notebooks/03*.ipynb notebooks/07*.ipynb notebooks/01*.ipynb} \
    | NOTEBOOK_LIMIT_S=${NOTEBOOK_LIMIT_S:-420} xargs -P "${NOTEBOOK_LANES:-3}" -I{} bash -c 'notebook {}'
}
for pass in ${PASS}; do
  REC=/tmp/rec_$pass; mkdir -p "$OUT" "$REC"
  log="$OUT/pass_${pass}.log"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$log"
  # Autotuning results kept on disk (Triton's cache) in the recording passes: each part of a suite is a
  # fresh process, and fla's kernels would otherwise autotune again in each one. A key is tuned once,
  # in the first recording process that meets it, alone on the GPU (pass C, which shares the GPU,
  # keeps none).
  case "$pass" in A|L|B|G) export TRITON_CACHE_AUTOTUNING=1 ;; esac
  case "$pass" in
    A)
      record packing-study 420 8-15 &
      record schedulers 450 0-7
      record hello-world 60 0-7
      record pitfalls 120 0-7
      record training-loop 120 0-7
      record profiling 150 0-7
      record masking 90 0-7
      wait
      record buckets 180 ;;
    L)
      # The suite keeps its parts within 540 s (SUITE_BUDGET_S), or within ATTN_GYM_LITE_LA_BUDGET_S
      # when set, and is killed 40 s after. ATTN_GYM_LITE_LA_BUDGET_S=rest: what is left of
      # CALL_LIMIT_S (default 560) since this script started (PASS="C L": L after the tests).
      if [ "${ATTN_GYM_LITE_LA_BUDGET_S:-}" = rest ]; then
        export ATTN_GYM_LITE_LA_BUDGET_S=$(( ${CALL_LIMIT_S:-560} - SECONDS - 40 ))
      fi
      record linear-attention $(( ${ATTN_GYM_LITE_LA_BUDGET_S:-540} + 40 )) ;;
    B)
      # end-to-end, then (LARGE=1) end-to-end-large, then notebook 08 in GPU mode on these fresh
      # recordings (it reads them: copied into the tree here; bring them back from results_B).
      record end-to-end "${E2E_LIMIT_S:-440}"
      # With LARGE=1 the call holds about 520 s: end-to-end 226 s, end-to-end-large 208 s, notebook 83 s.
      if [ "${LARGE:-0}" = 1 ]; then record end-to-end-large "${LARGE_LIMIT_S:-300}"; fi
      cp "$REC"/*.json attn_gym_lite/results/h200/
      NOTEBOOK_LIMIT_S=${NOTEBOOK_LIMIT_S:-150} notebook notebooks/08_putting_it_together.ipynb
      tail -1 "$LOGS/nb_08_putting_it_together.log" | tee -a "$log"; pack_logs ;;
    G) record end-to-end-large "${LARGE_LIMIT_S:-540}" ;;
    S)
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      record scale-out 480 ;;  # three launches of at most 150 + 150 + 90 s, plus stopping a hung one
    C)
      start=$SECONDS
      while sleep 30; do pack_logs; done &  # a call killed at its limit still returns the logs so far
      packer=$!
      # --timeout (pytest-timeout, on the host): one hung test fails alone instead of ending the run.
      # --durations: the slowest tests, to keep the lanes balanced. At 6d5d3ee one lane of all the
      # `gpu` tests stopped at its limit after 72 of 100 (the linear-attention suite tests are slow
      # beside the notebooks), so those run in their own lane.
      # -v names each test as it starts (a lane killed at its limit shows the test it was in), and
      # ATTN_GYM_LITE_FAILURE_LOG (tests/conftest.py) writes each failure's report as it happens:
      # at 81d01ba a lane killed at its limit had printed one F and no name or traceback.
      lane() {  # lane NAME PYTEST_ARGS...: one test lane in the background, its PID added to $lanes
        local name=$1; shift
        # OMP_NUM_THREADS: the lanes and notebooks share 16 cores; every process's CPU float64
        # references would otherwise start 16 threads each.
        OMP_NUM_THREADS=${LANE_THREADS:-4} ATTN_GYM_LITE_FAILURE_LOG="$LOGS/failures_$name.log" timeout "${TEST_LIMIT_S:-400}" \
          python3 -m pytest -v -rfEs -p no:cacheprovider --timeout=120 --durations=15 "$@" > "$LOGS/tests_$name.log" 2>&1 &
        lanes="$lanes $!"
      }
      lanes=""
      if [ -n "${TEST_IDS:-}" ]; then
        # TEST_IDS: files of test node ids (one per line, as `pytest --collect-only -q` prints them),
        # one lane per file: to finish a run that an earlier call cut, without repeating what passed.
        for ids in $TEST_IDS; do
          mapfile -t selected < "$ids"
          lane "$(basename "$ids" .txt)" "${selected[@]}"
        done
      else
        lane gpu -m gpu tests --ignore=tests/test_linear_attention_suite.py
        lane gpu_la -m gpu tests/test_linear_attention_suite.py
        if [ "${UNFILTERED:-1}" = 1 ]; then
          lane unfiltered tests/test_kernels.py tests/test_properties.py tests/test_malformed_layouts.py tests/test_kda_triton.py
        else echo "unfiltered kernel and property tests not run (UNFILTERED=0)" > "$LOGS/tests_unfiltered.log"; fi
      fi
      # Heaviest first, so that the lanes finish together (09 alone took 275-300 s in GPU mode).
      # NOTEBOOKS=none: tests only (the notebooks already ran in GPU mode at this code).
      if [ "${NOTEBOOKS:-}" != none ]; then
        notebooks
      fi
      # The test lanes by their PIDs: a bare `wait` (or one given nothing, if `jobs` had already
      # dropped the finished lanes) would wait for the log packer's endless loop too.
      # Each lane's pytest exit status: 0 passed, 124/137 cut at its limit (timeout), anything
      # else a failure, an error or a bad id list (pytest's own codes 1-5).
      failed_lanes=""
      for pid in $lanes; do
        wait "$pid"; status=$?
        case $status in 0|124|137) ;; *) failed_lanes="$failed_lanes $status" ;; esac
      done
      kill "$packer" 2>/dev/null
      for f in "$LOGS"/tests_*.log; do
        echo "== $f"
        if summary=$(grep -E "^=*.* in [0-9.]+s" "$f" | tail -1) && [ -n "$summary" ]; then
          echo "$summary"
          grep -E "^(FAILED|ERROR) " "$f" | head -20
        else  # no pytest summary: killed at its limit (then -v's last line names the test), or never started
          echo "no summary (cut at its limit, or pytest did not start); last lines:"; tail -3 "$f"
        fi
      done | tee -a "$log"
      cat "$LOGS"/failures_*.log 2>/dev/null | head -c 6000 | tee -a "$log"
      for f in "$LOGS"/nb_*.log; do tail -1 "$f"; done 2>/dev/null | tee -a "$log"
      # STOP_ON_FAILURE=1 (with PASS="C A", say): a failing test skips the recording passes after C.
      # A lane's exit status catches failures and bad id lists; the failure log also catches a test
      # that failed in a lane later cut at its limit (status 124, as at 81d01ba).
      if [ "${STOP_ON_FAILURE:-0}" = 1 ] && { [ -n "$failed_lanes" ] || cat "$LOGS"/failures_*.log 2>/dev/null | grep -q .; }; then
        echo "pass C: a test failed (lane exit statuses:${failed_lanes:- none}), so the passes after it do not run (STOP_ON_FAILURE=1)" | tee -a "$log"
        stop=1
      fi
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
    T)
      # One suite run per notebook: each one's file is in the tarball as soon as it has finished.
      for nb in $(ls ${NOTEBOOKS:-notebooks/*.ipynb}); do
        ATTN_GYM_LITE_NOTEBOOKS="$nb" record notebooks 560
      done ;;
    N)
      notebooks
      for f in "$LOGS"/nb_*.log; do tail -1 "$f"; done | tee -a "$log"
      # nbmake --overwrite left each notebook's outputs in it: the values its glue() calls computed here.
      python3 scripts/sync_prose.py --check --executed notebooks | tee -a "$log" ;;
    X)
      # EXPLORE names which explorations run, in order (default "forward kda"); each gets EXPLORE_S seconds.
      declare -A scripts=([forward]="explore_hopper_forward.py" [kda]="explore_kda.py --budget"
                          [backward]="explore_atomic_backward.py" [short_conv]="explore_short_conv.py --budget"
                          [schedules]="explore_schedules.py --budget" [prefetch]="explore_schedules.py --prefetch --budget"
                          [kda_options]="explore_kda_split.py --budget" [backward_ws]="explore_hopper_backward.py")
      for name in ${EXPLORE:-forward kda}; do
        timeout $(( ${EXPLORE_S:-100} + 30 )) python3 scripts/${scripts[$name]} "${EXPLORE_S:-100}" \
          > "$LOGS/explore_$name.log" 2>&1
        echo "explore $name: rc $?" | tee -a "$log"; tail -32 "$LOGS/explore_$name.log" | tee -a "$log"
      done ;;
    *) echo "unknown pass $pass (A, L, B, G, C, N, T, S or X)" | tee -a "$log"; exit 2 ;;
  esac
  ls -la "$REC" | tee -a "$log"
  pack_logs
  if [ "${stop:-0}" = 1 ]; then exit 3; fi
done
