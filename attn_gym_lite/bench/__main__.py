"""``python -m attn_gym_lite.bench SUITE --out DIR``: run a suite on this GPU, write DIR/SUITE.json."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import torch
import typer

from .provenance import provenance
from .suites import SUITES

app = typer.Typer(add_completion=False)


@app.command()
def main(
    suite: str = typer.Argument(..., help=f"one of: {', '.join(SUITES)}"),
    out: Path = typer.Option(..., help="folder for SUITE.json, e.g. results/h200"),
) -> None:
    """Run one benchmark suite on the current GPU and record it with provenance."""
    if suite not in SUITES:
        raise typer.BadParameter(f"SUITE must be one of {', '.join(SUITES)}, got {suite!r}")
    if not torch.cuda.is_available():
        typer.echo("error: benchmarks record GPU measurements; no CUDA device is available", err=True)
        raise typer.Exit(code=1)
    out.mkdir(parents=True, exist_ok=True)
    run = SUITES[suite]
    # A suite that writes files beside its JSON (the profiling traces) takes the folder.
    extra = {"out": out} if "out" in inspect.signature(run).parameters else {}
    record = {"suite": suite, "provenance": provenance(), **run(**extra)}
    path = out / f"{suite.replace('-', '_')}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    typer.echo(f"wrote {path}")


if __name__ == "__main__":
    app()
