#!/usr/bin/env bash
# One full GPU-host pass (see book/reproducing.md): install the carried wheels, record the
# benchmark suites into $OUT (and results/h200 here, so tests and notebooks read them), run every
# test, then execute every notebook in GPU mode. Logs and JSON land in $OUT.
# Usage on the host: ATTN_GYM_LITE_GIT_COMMIT=<sha> bash scripts/gpu_run.sh [suite ...]
set -uo pipefail
bash scripts/gpu_host_install.sh || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 ATTN_GYM_LITE_CACHE=/tmp/agl-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" results/h200
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
suites=${*:-hello-world training-loop pitfalls}
for suite in $suites; do
  python3 -m attn_gym_lite.bench "$suite" --out "$OUT" 2>&1 | tail -20 | tee -a "$OUT/bench.log"
done
cp "$OUT"/*.json results/h200/
python3 -m pytest -q -rs tests 2>&1 | tail -60 | tee "$OUT/pytest.log"
python3 -m pytest -q --nbmake --overwrite notebooks 2>&1 | tail -40 | tee "$OUT/notebooks.log"
python3 - <<'PY' >> "$OUT/notebooks.log"
import json, glob
for path in sorted(glob.glob("notebooks/*.ipynb")):
    for cell in json.load(open(path))["cells"]:
        for out in cell.get("outputs", []):
            text = "".join(out.get("text", "")) if out.get("output_type") == "stream" else ""
            if text.strip():
                print(f"--- {path}\n{text.strip()[:1500]}")
PY
