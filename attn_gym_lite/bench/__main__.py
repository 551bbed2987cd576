"""``python -m attn_gym_lite.bench SUITE --out DIR``: run a suite, write ``DIR/<suite>.json``.

``python -m attn_gym_lite.bench --help`` lists the suites; ``... SUITE --help`` says what one
measures.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import typer

from .provenance import provenance
from .suites import SUITES, Suite

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Run a benchmark suite and record it, with provenance, as OUT/<suite>.json.")


def record(suite: Suite, out: Path) -> Path:
    """Run ``suite`` and write its record; returns the file written.

    Raises:
        RuntimeError: the suite needs CUDA and none is available.
    """
    if suite.needs_cuda and not torch.cuda.is_available():
        raise RuntimeError(f"{suite.name} records GPU measurements; no CUDA device is available")
    out.mkdir(parents=True, exist_ok=True)
    run = suite.load()
    result = run(out=out) if suite.writes_files else run()
    path = out / f"{suite.name.replace('-', '_')}.json"
    path.write_text(json.dumps({"suite": suite.name, "provenance": provenance(suite.module), **result}, indent=1) + "\n")
    return path


def _command(suite: Suite):
    def command(out: Path = typer.Option(..., help="folder for the JSON, e.g. results/h200")) -> None:
        try:
            path = record(suite, out)
        except RuntimeError as error:
            typer.echo(f"error: {error}", err=True)
            raise typer.Exit(code=1) from None
        typer.echo(f"wrote {path}")

    command.__doc__ = suite.summary
    return command


for _suite in SUITES.values():
    app.command(_suite.name, help=_suite.summary)(_command(_suite))


if __name__ == "__main__":
    app()
