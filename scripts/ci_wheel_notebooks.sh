#!/usr/bin/env bash
# Every notebook run the way a reader outside the checkout runs it: build the package's wheel, install
# it with the [notebooks,tiktoken] extras into a fresh virtual environment that cannot see the source
# tree, copy the notebooks to a temporary folder and execute each with nbmake there. A probe notebook
# first asserts, inside the very kernel nbmake starts, that `import attn_gym_lite` is the installed
# wheel (site-packages of this venv, not the checkout) and that it carries every recording.
# Usage (CI runs it from .ci/run): bash scripts/ci_wheel_notebooks.sh
# Environment: CI_TORCH (default torch==2.13.0, the CPU build .ci/run installs), KEEP=1 keeps the
# temporary folder.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/agl-wheel.XXXXXX")"
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT
unset PYTHONPATH
start=$SECONDS
phase() { echo "[wheel-notebooks] $1 ($((SECONDS - start)) s)"; }

# The wheel is built from a copy of the tracked (and not ignored) files, so the build leaves nothing
# in the checkout and sees what a clone would.
mkdir -p "$work/src" "$work/dist" "$work/run"
git -C "$root" ls-files -z --cached --others --exclude-standard \
  | tar -C "$root" --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -C "$work/src" -xf -
python3 -m venv "$work/venv"
py="$work/venv/bin/python"
"$py" -m pip install -q "${CI_TORCH:-torch==2.13.0}"
"$py" -m pip wheel -q --no-deps -w "$work/dist" "$work/src"
wheel="$(ls "$work"/dist/attn_gym_lite-*.whl)"
phase "built $(basename "$wheel")"
# What requirements.txt pins for running notebooks, beside the wheel's own dependencies.
"$py" -m pip install -q "${wheel}[notebooks,tiktoken]" "pytest>=8" "nbmake>=1.5" "ipykernel>=6.29,<7"
phase "installed the wheel into $work/venv"

cp "$root"/notebooks/*.ipynb "$work/run/"
"$py" - "$work/run/probe_installed_package.ipynb" "$root" <<'PY'
import sys, nbformat
probe = f"""
import sys, pathlib
import attn_gym_lite
from attn_gym_lite.book.results import RESULTS_ROOT, load_result
package = pathlib.Path(attn_gym_lite.__file__).resolve().parent
checkout = pathlib.Path({sys.argv[2]!r}).resolve()
venv = pathlib.Path(sys.prefix).resolve()
assert package.parent.name == "site-packages" and venv in package.parents, f"attn_gym_lite imported from {{package}}, not {{venv}}'s site-packages"
assert checkout not in package.parents and checkout != package.parent, f"attn_gym_lite imported from the checkout: {{package}}"
shipped = sorted(p.relative_to(RESULTS_ROOT).as_posix() for p in RESULTS_ROOT.rglob("*") if p.is_file())
expected = sorted(p.relative_to(checkout / "attn_gym_lite" / "results").as_posix()
                  for p in (checkout / "attn_gym_lite" / "results").rglob("*") if p.is_file())
assert shipped == expected, f"the wheel's recordings {{shipped}} differ from the checkout's {{expected}}"
assert load_result("profiling")["suite"] == "profiling"
print("attn_gym_lite", attn_gym_lite.__version__, "from", package, "with", len(shipped), "recordings")
"""
nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(probe)],
               metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}),
               sys.argv[1])
PY
cd "$work/run"
"$py" -m pytest -q -p no:cacheprovider --nbmake probe_installed_package.ipynb
phase "probe: the kernel imports the installed wheel"
chapters=()
for path in "$root"/notebooks/*.ipynb; do chapters+=("$(basename "$path")"); done
"$py" -m pytest -q -p no:cacheprovider --nbmake "${chapters[@]}"
phase "every notebook ran from $work/run against the installed wheel"
