#!/usr/bin/env bash
# A GPU-host pass (see book/reproducing.md): install the carried wheels, then the stages named in
# $STAGES (default all three):
#   bench      record the suites (arguments, default all) into $OUT, and into results/h200 here so
#              tests and notebooks read them;
#   test       run every test;
#   notebooks  execute every notebook in GPU mode and print their text output.
# Logs and JSON land in $OUT.
# Usage on the host: ATTN_GYM_LITE_GIT_COMMIT=<sha> [STAGES="bench"] bash scripts/gpu_run.sh [suite ...]
set -uo pipefail
bash scripts/gpu_host_install.sh || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 ATTN_GYM_LITE_CACHE=/tmp/agl-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" results/h200
STAGES=${STAGES:-bench test notebooks}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
if [[ $STAGES == *bench* ]]; then
  for suite in ${*:-hello-world training-loop pitfalls schedulers masking buckets packing-study profiling end-to-end}; do
    start=$SECONDS
    python3 -m attn_gym_lite.bench "$suite" --out "$OUT" 2>&1 | tail -20 | tee -a "$OUT/bench.log"
    echo "$suite: $((SECONDS - start)) s" | tee -a "$OUT/bench.log"
  done
  cp "$OUT"/*.json results/h200/ 2>/dev/null
  [[ -d "$OUT/profiling_traces" ]] && cp -r "$OUT/profiling_traces" results/h200/
fi
if [[ $STAGES == *test* ]]; then
  python3 -m pytest -q -rs tests 2>&1 | tail -60 | tee "$OUT/pytest.log"
fi
if [[ $STAGES == *notebooks* ]]; then
  python3 -m pytest -q --durations=0 --nbmake --overwrite notebooks 2>&1 | tail -60 | tee "$OUT/notebooks.log"
  python3 - <<'PY' >> "$OUT/notebooks.log"
import json, glob
for path in sorted(glob.glob("notebooks/*.ipynb")):
    for cell in json.load(open(path))["cells"]:
        for out in cell.get("outputs", []):
            text = "".join(out.get("text", "")) if out.get("output_type") == "stream" else ""
            if text.strip():
                print(f"--- {path}\n{text.strip()[:1500]}")
PY
fi
