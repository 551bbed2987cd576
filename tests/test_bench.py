"""The benchmark CLI's provenance, the recorded results, and the figures drawn from them."""

import json
import os
import re
import shutil
import subprocess
import sys

import matplotlib
import pytest
import torch

import attn_gym_lite
from attn_gym_lite.bench import provenance as provenance_module
from attn_gym_lite.bench.provenance import PACKAGE_ROOT, provenance, source_digest, source_files
from attn_gym_lite.bench.suites import SUITES
from attn_gym_lite.book import results as results_module
from attn_gym_lite.book.figures.ch01_ragged import plot_packed_batch
from attn_gym_lite.book.figures.ch02_capture import plot_hello_world, plot_training_loop
from attn_gym_lite.book.results import DECLARED_STALE, RESULTS_ROOT, banner, declared_stale, load_result, provenance_line

RECORDED = sorted(RESULTS_ROOT.glob("*/*.json"))
PROVENANCE_KEYS = {"gpu", "driver", "cuda", "torch", "triton", "python", "date", "command", "commit",
                   "package_version", "source_sha256"}


def test_provenance_has_every_field():
    record = provenance("attn_gym_lite.bench.hello_world")
    assert set(record) == PROVENANCE_KEYS
    assert record["torch"] == torch.__version__
    assert record["command"].startswith("python -m attn_gym_lite.bench")
    assert record["package_version"] == attn_gym_lite.__version__
    assert record["source_sha256"] == source_digest("attn_gym_lite.bench.hello_world")


def test_source_digest_covers_exactly_what_a_suite_imports(tmp_path, monkeypatch):
    files = {str(p.relative_to(PACKAGE_ROOT)) for p in source_files("attn_gym_lite.bench.schedulers")}
    # the suite, the kernels it times (through ops.kernels' __init__), the helpers they use
    assert {"bench/schedulers.py", "ops/kernels/forward.py", "ops/kernels/tasks.py", "schedule.py",
            "checks.py", "isolation.py", "__init__.py"} <= files
    # nothing it does not import: the book's figures, profiling, other suites
    assert not any(f.startswith(("book/", "profiling/")) or f == "bench/masking.py" for f in files)
    # one changed byte anywhere in those files changes the digest
    copy = tmp_path / "attn_gym_lite"
    shutil.copytree(PACKAGE_ROOT, copy)
    before = source_digest("attn_gym_lite.bench.schedulers")
    monkeypatch.setattr(provenance_module, "PACKAGE_ROOT", copy)
    assert source_digest("attn_gym_lite.bench.schedulers") == before
    kernel = copy / "ops" / "kernels" / "tasks.py"
    kernel.write_text(kernel.read_text() + "\n")
    assert source_digest("attn_gym_lite.bench.schedulers") != before
    assert source_digest("attn_gym_lite.bench.packing") == source_digest("attn_gym_lite.bench.packing")


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_recordings_are_not_stale(path):
    """A recording made by other code than today's must be re-recorded (README: Record results),
    unless book/stale_recordings.json declares it, with the reason; a declared one must really be stale."""
    record = json.loads(path.read_text())
    suite = SUITES[record["suite"]]
    fresh = record["provenance"].get("source_sha256") == source_digest(suite.module)
    reason = declared_stale().get(f"{path.parent.name}/{path.name}")
    if reason is not None:
        assert not fresh, f"{path.name} matches today's code: remove it from {DECLARED_STALE.name}"
        assert len(reason) > 40, f"{DECLARED_STALE.name} must say why {path.name} was not re-recorded"
        return
    assert fresh, (
        f"{path.name} was recorded by other code than today's {suite.module} and what it imports: "
        f"re-record it with python -m attn_gym_lite.bench {suite.name} --out {path.parent}"
    )


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_shipped_recordings_have_no_failed_or_skipped_part(path):
    """A suite records a part that raised, hung or ran out of budget under "errors" and goes on: a
    recording with such a part is incomplete and is re-made, or declared stale with the reason."""
    if f"{path.parent.name}/{path.name}" not in declared_stale():
        assert not json.loads(path.read_text()).get("errors"), f"{path.name} has parts that did not run"


def test_declared_stale_recordings_exist_and_the_banner_says_why(tmp_path, monkeypatch):
    for name in declared_stale():
        assert (RESULTS_ROOT / name).is_file(), f"{DECLARED_STALE.name} names {name}, which is not a recording"
    # The mechanism on a made-up folder: a declared recording carries its reason into the banner.
    monkeypatch.setattr(results_module, "DECLARED_STALE", tmp_path / "stale.json")
    (tmp_path / "h200").mkdir()
    record = {"suite": "hello-world", "provenance": json.loads((RESULTS_ROOT / "h200" / "hello_world.json").read_text())["provenance"]}
    (tmp_path / "h200" / "hello_world.json").write_text(json.dumps(record))
    assert "declared_stale" not in load_result("hello-world", root=tmp_path)
    (tmp_path / "stale.json").write_text(json.dumps({"h200/hello_world.json": "the suite timed out on the GPU host"}))
    loaded = load_result("hello-world", root=tmp_path)
    assert loaded["declared_stale"] == "the suite timed out on the GPU host"
    assert "Older than this package: the suite timed out on the GPU host" in banner(loaded, "x")


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_recorded_results_come_from_the_cli_on_a_gpu(path):
    record = json.loads(path.read_text())
    p = record["provenance"]
    assert set(p) == PROVENANCE_KEYS
    assert p["gpu"]["name"] and p["gpu"]["sm_count"] > 0 and p["cuda"]
    assert p["command"].startswith(f"python -m attn_gym_lite.bench {record['suite']} --out ")
    assert record["suite"] in SUITES and path.stem == record["suite"].replace("-", "_")
    # A full 40-hex commit, nothing else (a hand-typed short one names no commit).
    assert re.fullmatch(r"[0-9a-f]{40}", p["commit"] or ""), (
        f"a recording must name the full commit it measured, not {p['commit']!r}")


def test_load_result_names_what_exists(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_result("nope")
    mine = tmp_path / "my-gpu"
    mine.mkdir()
    minimal = {"suite": "packing-study", "provenance": {"gpu": None, "date": "2026-12-02", "command": "x", "commit": None}}
    (mine / "packing_study.json").write_text(json.dumps(minimal))
    assert load_result("packing-study", gpu="my-gpu", root=tmp_path) == minimal


def test_banner_and_provenance_line():
    record = load_result("hello-world")
    line = provenance_line(record)
    assert record["provenance"]["gpu"]["name"] in line and record["provenance"]["torch"] in line
    # A CPU-only suite recorded without a GPU says so, instead of "no GPU (? SMs), driver None, CUDA None".
    cpu_made = {"provenance": {**record["provenance"], "gpu": None, "driver": None, "cuda": None}}
    assert provenance_line(cpu_made).startswith("a CPU (no GPU), torch ")
    assert "None" not in provenance_line(cpu_made).split(", commit")[0]
    if not torch.cuda.is_available():
        assert banner(record, "the timings").startswith("CPU mode: no CUDA device here, so the timings did not run.")


def test_figures_draw_from_recordings():
    matplotlib.use("Agg")
    fig = plot_hello_world(load_result("hello-world"))
    bars = [p.get_height() for ax in fig.axes for p in ax.patches]
    runs = load_result("hello-world")["runs"]
    assert bars == [v for r in runs for v in (r["eager_wall_us"], r["replay_wall_us"])]
    fig = plot_training_loop(load_result("training-loop"))
    assert len(fig.axes[0].lines) == 4  # per step and running mean, for eager and graph
    eager = load_result("training-loop")["eager"]["losses"]
    assert list(fig.axes[0].lines[0].get_ydata()) == eager
    assert fig.axes[0].lines[1].get_ydata()[0] == pytest.approx(sum(eager[:20]) / 20)
    ax = plot_packed_batch(torch.tensor([0, 3, 7, 7], dtype=torch.int32), 10)
    assert [p.get_width() for p in ax.patches] == [3, 4, 3]  # two sequences, then 3 rows of padding


def test_cli_refuses_without_cuda(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("checks the CPU-only refusal")
    done = subprocess.run([sys.executable, "-m", "attn_gym_lite.bench", "hello-world", "--out", str(tmp_path)],
                          capture_output=True, text=True)
    assert done.returncode != 0 and "no CUDA device is available" in done.stderr
    assert not list(tmp_path.iterdir())


def _fake_suite(monkeypatch, function):
    """A CPU suite named 'fake' that runs ``function`` (set on a real suite module, so the CLI's
    import and provenance paths run as for a real suite)."""
    from attn_gym_lite.bench import hello_world
    from attn_gym_lite.bench.suites import Suite

    monkeypatch.setattr(hello_world, "fake_suite", function, raising=False)
    return Suite("fake", "attn_gym_lite.bench.hello_world", "fake_suite", "A fake suite.", gpus=0, writes_files=True)


def test_cli_record_publishes_the_suites_files_and_json(tmp_path, monkeypatch):
    from attn_gym_lite.bench.__main__ import record

    def suite(out):
        (out / "traces").mkdir()
        (out / "traces" / "a.json.gz").write_bytes(b"trace")
        return {"value": 3}

    path = record(_fake_suite(monkeypatch, suite), tmp_path)
    assert path == tmp_path / "fake.json"
    written = json.loads(path.read_text())
    assert written["suite"] == "fake" and written["value"] == 3 and set(written["provenance"]) == PROVENANCE_KEYS
    assert (tmp_path / "traces" / "a.json.gz").read_bytes() == b"trace"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake.json", "traces"]  # no staging folder left


@pytest.mark.parametrize("error", [KeyboardInterrupt, ValueError])
def test_cli_record_interrupted_leaves_the_old_recording(tmp_path, monkeypatch, error):
    """Ctrl-C (or a failure) in the middle of a suite: no half-written file, the earlier recording kept."""
    from attn_gym_lite.bench.__main__ import record

    (tmp_path / "fake.json").write_text('{"old": 1}\n')

    def suite(out):
        (out / "traces").mkdir()
        (out / "traces" / "a.json.gz").write_bytes(b"half")
        (out / "fake.json").write_text('{"half')
        raise error()

    with pytest.raises(error):
        record(_fake_suite(monkeypatch, suite), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake.json"]
    assert (tmp_path / "fake.json").read_text() == '{"old": 1}\n'


def test_cli_refuses_an_out_that_is_not_a_folder_before_running(tmp_path):
    from typer.testing import CliRunner

    from attn_gym_lite.bench.__main__ import app

    afile = tmp_path / "afile"
    afile.write_text("keep")
    result = CliRunner().invoke(app, ["packing-study", "--out", str(afile)])
    assert result.exit_code == 2 and "error:" in result.output and afile.read_text() == "keep"


def test_cli_help_says_what_each_suite_runs_on_in_plain_text():
    from typer.testing import CliRunner

    from attn_gym_lite.bench.__main__ import app

    text = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"}).output
    for suite in SUITES.values():
        line = next(row for row in text.splitlines() if f" {suite.name} " in row)
        assert ("(CPU only)" in line) == (not suite.needs_cuda) and ("GPU" in line) == suite.needs_cuda
    assert not any(markup in text for markup in ("``", ":class:", ":mod:", ":func:"))


def test_cli_record_refuses_a_commit_that_is_not_a_full_one_before_running(tmp_path, monkeypatch):
    """A recording names the full commit it measured: a hand-typed short or decorated one is refused
    before the suite runs."""
    from attn_gym_lite.bench.__main__ import record
    from attn_gym_lite.bench.provenance import git_commit

    ran = []
    suite = _fake_suite(monkeypatch, lambda out: ran.append(out) or {"value": 1})
    for bad in ["f3e7c20c", "F3E7C20B253B0C9975B6B73D87798EE64F491532", "f3e7c20b253b0c9975b6b73d87798ee64f491532+dirty"]:
        monkeypatch.setenv("ATTN_GYM_LITE_GIT_COMMIT", bad)
        with pytest.raises(ValueError, match=r"^ATTN_GYM_LITE_GIT_COMMIT must be the full commit .* got '" + re.escape(bad)):
            record(suite, tmp_path)
    assert ran == [] and list(tmp_path.iterdir()) == []
    full = "f3e7c20b253b0c9975b6b73d87798ee64f491532"
    monkeypatch.setenv("ATTN_GYM_LITE_GIT_COMMIT", full)
    assert git_commit() == full
    assert json.loads(record(suite, tmp_path).read_text())["provenance"]["commit"] == full


def test_every_recording_is_package_data():
    """A wheel carries the recordings (the notebooks read them wherever they are installed): every file
    under RESULTS_ROOT matches a package-data pattern of pyproject.toml (CI also installs the wheel)."""
    tomllib = pytest.importorskip("tomllib")
    from pathlib import PurePosixPath

    pyproject = tomllib.loads((PACKAGE_ROOT.parent / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["attn_gym_lite"]
    files = [p.relative_to(PACKAGE_ROOT).as_posix() for p in RESULTS_ROOT.rglob("*") if p.is_file()]
    assert RESULTS_ROOT == PACKAGE_ROOT / "results" and len(files) >= 10
    unshipped = [f for f in files if "__pycache__" not in f
                 and not any(PurePosixPath(f).match(pattern) and f.count("/") == pattern.count("/") for pattern in patterns)]
    assert not unshipped, f"recordings a wheel would leave out (add them to package-data): {unshipped}"




def _notebook(path, *code):
    cells = [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "execution_count": None, "outputs": [], "source": c}
             for i, c in enumerate(code)] + [{"cell_type": "markdown", "id": "m", "metadata": {}, "source": "prose"}]
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_notebooks_suite_records_each_notebooks_time_memory_and_digest(tmp_path, monkeypatch):
    """In a child process, as `make test` keeps notebook clients out of the unit tests' process; a
    stand-in nvidia-smi reports two GPUs, 1000 and 50 MiB in use at first, then 3048 and 60."""
    pytest.importorskip("nbclient"), pytest.importorskip("ipykernel")  # the notebooks extra
    from attn_gym_lite.bench.notebooks import notebook_digest, notebooks_suite
    from attn_gym_lite.book.results import notebook_run
    from attn_gym_lite.isolation import IsolatedRunError, run_isolated

    (tmp_path / "bin").mkdir()
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.write_text('#!/bin/sh\ntest -e $0.x && printf "3048\\n60\\n" || printf "1000\\n50\\n"; touch $0.x\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    path = _notebook(tmp_path / "01_a.ipynb", "import time\ntime.sleep(1.0)", "open('ran', 'w').close()")
    monkeypatch.setenv("ATTN_GYM_LITE_NOTEBOOKS", str(tmp_path / "*.ipynb"))
    assert run_isolated(notebooks_suite, str(tmp_path / "h200"), timeout_s=300) == {"notebooks": ["01_a"]}
    run = json.loads((tmp_path / "h200" / "notebook_runs" / "01_a.json").read_text())
    assert (tmp_path / "ran").is_file() and run["seconds"] >= 1.0 and run["peak_gib"] == 2.0
    assert run["notebook_sha256"] == notebook_digest(path)
    run["provenance"] |= {"gpu": {"name": "NVIDIA H200"}, "commit": "ab" * 20}
    (tmp_path / "h200" / "notebook_runs" / "01_a.json").write_text(json.dumps(run))
    (tmp_path / "h200" / "notebook_runs" / "02_b.json").write_text(json.dumps(run | {"peak_gib": None}))
    assert f"in {run['seconds']:.0f} s on one NVIDIA H200 and used at most 2.0 GiB" in notebook_run("01_a", root=tmp_path)
    assert "GiB" not in notebook_run("02_b", root=tmp_path) and "not recorded yet" in notebook_run("03_c", root=tmp_path)
    # The digest: code (magics too) and the package modules it imports, not prose.
    code = "%matplotlib inline\nfrom attn_gym_lite.ragged import cu_seqlens_from_lengths"
    (tmp_path / "d").mkdir()  # outside the suite's selection
    before = notebook_digest(path := _notebook(tmp_path / "d" / "a.ipynb", code))
    assert notebook_digest(_notebook(tmp_path / "d" / "b.ipynb", code + "\nx = 1")) != before
    notebook = json.loads(path.read_text())
    path.write_text(json.dumps(notebook | {"cells": [*notebook["cells"], {**notebook["cells"][-1], "source": "more"}]}))
    assert notebook_digest(path) == before
    shutil.copytree(PACKAGE_ROOT, tmp_path / "copy")
    monkeypatch.setattr(provenance_module, "PACKAGE_ROOT", tmp_path / "copy")
    assert notebook_digest(path) == before
    (tmp_path / "copy" / "ragged.py").write_text((tmp_path / "copy" / "ragged.py").read_text() + "\n")
    assert notebook_digest(path) != before
    _notebook(tmp_path / "02_b.ipynb", "1 / 0")  # a failing cell fails the suite
    with pytest.raises(IsolatedRunError, match="ZeroDivisionError"):
        run_isolated(notebooks_suite, str(tmp_path / "h200"), timeout_s=300)
