"""``python -m attn_gym_lite.bench SUITE --out DIR``: run a suite, write ``DIR/<suite>.json``.

``--help`` lists the suites. Ctrl-C stops a suite cleanly: nothing of the interrupted run is left
in ``DIR``, and an earlier recording there is kept as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
import typer

from .provenance import git_commit, provenance
from .suites import SUITES, Suite

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Run a benchmark suite and record it, with provenance, as OUT/<suite>.json.")


def _publish(staging: Path, out: Path, result_name: str) -> None:
    """Move every file under ``staging`` to ``out``, each by one rename; the JSON last, so it never
    names files that are not there yet."""
    files = sorted(p for p in staging.rglob("*") if p.is_file() and p.name != result_name)
    for source in [*files, staging / result_name]:
        target = out / source.relative_to(staging)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(source, target)


def record(suite: Suite, out: Path) -> Path:
    """Run ``suite`` and write ``out/<suite>.json`` (dashes as underscores) with its provenance.

    The suite writes into a hidden staging folder in ``out``, renamed into place only when it has
    finished: a failed or interrupted run leaves nothing behind, and an earlier recording stays.
    """
    if suite.needs_cuda and not torch.cuda.is_available():
        raise RuntimeError(f"{suite.name} records GPU measurements; no CUDA device is available")
    git_commit()  # a malformed $ATTN_GYM_LITE_GIT_COMMIT is refused before the suite runs, not after
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{suite.name.replace('-', '_')}.json"
    staging = Path(tempfile.mkdtemp(prefix=f".{path.stem}.", suffix=".partial", dir=out))
    try:
        run = suite.load()
        result = run(out=staging) if suite.writes_files else run()
        text = json.dumps({"suite": suite.name, "provenance": provenance(suite.module), **result}, indent=1) + "\n"
        (staging / path.name).write_text(text)
        _publish(staging, out, path.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


def _command(suite: Suite):
    def command(out: Path = typer.Option(..., help="folder for the JSON (attn_gym_lite/results/<gpu> for the book)")) -> None:
        try:
            path = record(suite, out)
        except KeyboardInterrupt:
            typer.echo(f"interrupted: {suite.name} did not finish; nothing was written to {out}", err=True)
            raise typer.Exit(code=130) from None
        except (RuntimeError, OSError) as error:  # no CUDA; an --out that cannot be a folder
            typer.echo(f"error: {error}", err=True)
            raise typer.Exit(code=2 if isinstance(error, OSError) else 1) from None
        typer.echo(f"wrote {path}")

    command.__doc__ = suite.summary
    return command


for _suite in SUITES.values():
    app.command(_suite.name, help=_suite.summary)(_command(_suite))


if __name__ == "__main__":
    app()
