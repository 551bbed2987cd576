"""``python -m attn_gym_lite.bench SUITE --out DIR``: run a suite, write ``DIR/<suite>.json``.

``python -m attn_gym_lite.bench --help`` lists the suites; ``... SUITE --help`` says what one
measures. While a suite runs, a progress line on stderr shows its elapsed time (suites that count
their own work, like ``packing-study``, add their own bars). Ctrl-C stops it cleanly: nothing of
the interrupted run is left in ``DIR``, and an earlier recording there is kept as it was.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import torch
import typer
from tqdm.auto import tqdm

from ..checks import check_folder
from .provenance import git_commit, provenance
from .suites import SUITES, Suite

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Run a benchmark suite and record it, with provenance, as OUT/<suite>.json.")


@contextlib.contextmanager
def _elapsed(desc: str, enabled: bool, interval_s: float = 1.0) -> Iterator[None]:
    """A tqdm line ``desc: running, MM:SS elapsed`` on stderr, refreshed every ``interval_s``."""
    bar = tqdm(desc=desc, bar_format="{desc}: running, {elapsed} elapsed", disable=not enabled, file=sys.stderr)
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(interval_s):
            bar.refresh()

    ticker = threading.Thread(target=tick, daemon=True)
    if enabled:
        ticker.start()
    try:
        yield
    finally:
        stop.set()
        if enabled:
            ticker.join()
        bar.close()


def _publish(staging: Path, out: Path, result_name: str) -> None:
    """Move every file under ``staging`` to the same place under ``out``, each by one rename; the
    result JSON ``result_name`` last, so it never names files that are not there yet."""
    files = sorted(p for p in staging.rglob("*") if p.is_file() and p.name != result_name)
    for source in [*files, staging / result_name]:
        target = out / source.relative_to(staging)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(source, target)


def record(suite: Suite, out: Path, progress: bool = False) -> Path:
    """Run ``suite`` and write its record, ``out/<suite>.json`` (dashes as underscores); returns it.

    The suite writes into a hidden staging folder inside ``out`` (``.<suite>.*.partial``) and its
    files are renamed into place only when it has finished, the JSON last: an interrupted or
    failed run leaves nothing behind, and an earlier recording in ``out`` stays as it was.

    Args:
        suite: one of :data:`~attn_gym_lite.bench.suites.SUITES`.
        out: the folder for the record (created if missing).
        progress: show the elapsed-time line on stderr while the suite runs.

    Raises:
        RuntimeError: the suite needs CUDA and none is available.
        ValueError: ``$ATTN_GYM_LITE_GIT_COMMIT`` is set but not a full commit
            (:func:`~attn_gym_lite.bench.provenance.git_commit`): refused before the suite runs.
        TypeError: ``out`` is not a ``str`` or ``os.PathLike``.
        FileNotFoundError: ``out`` is a file, or the folder cannot be created (a parent is a file,
            no permission): refused before the suite runs.
        KeyboardInterrupt, or whatever the suite raised: passed on, after removing the staging folder.
    """
    if suite.needs_cuda and not torch.cuda.is_available():
        raise RuntimeError(f"{suite.name} records GPU measurements; no CUDA device is available")
    git_commit()  # a malformed $ATTN_GYM_LITE_GIT_COMMIT is refused before the suite runs, not after
    out = check_folder("out", out, must_exist=False)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # a parent is a file, no permission, ...: named before any work
        raise FileNotFoundError(f"out={str(out)!r}: cannot create the folder ({error.strerror})") from None
    path = out / f"{suite.name.replace('-', '_')}.json"
    staging = Path(tempfile.mkdtemp(prefix=f".{path.stem}.", suffix=".partial", dir=out))
    try:
        with _elapsed(suite.name, progress):
            run = suite.load()
            result = run(out=staging) if suite.writes_files else run()
        text = json.dumps({"suite": suite.name, "provenance": provenance(suite.module), **result}, indent=1) + "\n"
        (staging / path.name).write_text(text)
        _publish(staging, out, path.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


def _command(suite: Suite):
    def command(
        out: Path = typer.Option(..., help="folder for the JSON; attn_gym_lite/results/<gpu> in a checkout is where the book reads it"),
        progress: bool | None = typer.Option(None, "--progress/--no-progress",
                                      help="show the elapsed-time line (default: when stderr is a terminal)"),
    ) -> None:
        try:
            path = record(suite, out, progress=sys.stderr.isatty() if progress is None else progress)
        except RuntimeError as error:
            typer.echo(f"error: {error}", err=True)
            raise typer.Exit(code=1) from None
        except FileNotFoundError as error:  # a bad --out, refused before the suite ran
            typer.echo(f"error: --{error}", err=True)
            raise typer.Exit(code=2) from None
        except KeyboardInterrupt:
            typer.echo(f"interrupted: {suite.name} did not finish; nothing was written to {out}", err=True)
            raise typer.Exit(code=130) from None
        typer.echo(f"wrote {path}")

    command.__doc__ = suite.summary
    return command


for _suite in SUITES.values():
    app.command(_suite.name, help=_suite.summary)(_command(_suite))


if __name__ == "__main__":
    app()
