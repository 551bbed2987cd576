#!/usr/bin/env bash
# Download, into ./.whl (git-ignored), the wheels the offline GPU host needs (Python 3.12,
# manylinux x86_64). Packages already on the host image are removed: shadowing them breaks their
# plugins. Then carry .whl with the run and start it with scripts/gpu_host_install.sh.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any \
  -d .whl -r scripts/gpu_host_wheels.txt 2>&1 | grep -v '^WARNING: Location' || true
for p in attrs psutil pytest pluggy iniconfig python_dateutil typing_extensions pygments tzdata packaging numpy six \
         torch triton matplotlib pyarrow tokenizers tiktoken typer; do
  rm -f .whl/${p}-[0-9]*.whl
done
echo "wheels in .whl: $(ls .whl | wc -l), $(du -sh .whl | cut -f1)"
