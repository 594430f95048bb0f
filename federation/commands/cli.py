"""The ``gpufed`` command line: thin commands over the same core functions REST uses.

Each command group lives in its own module under ``federation.commands`` and is
registered here; nothing runs at import time.
"""

from __future__ import annotations

import sys

import typer

app = typer.Typer(
    name="gpufed",
    help="Sharded federation control plane for GPU-cluster monitoring.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: option names never cut at an 80-column terminal
)
bench_app = typer.Typer(
    help="Benchmarks that print figures (JSON with --json).", no_args_is_help=True, rich_markup_mode=None
)
app.add_typer(bench_app, name="bench")


def _register() -> None:
    # Imported here so that importing federation.commands.cli stays cheap and side-effect free.
    from federation.commands import bench, certs, demo, render, serve, size, watch

    render.register(app)
    bench.register(bench_app)
    watch.register(app)
    serve.register(app)
    demo.register(app)
    size.register(app)
    certs.register(app)


def version() -> str:
    """The installed distribution's version (the image's, when run there)."""
    from importlib import metadata

    try:
        return metadata.version("gpufed")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def main() -> None:
    if sys.argv[1:] == ["--version"]:
        typer.echo(f"gpufed {version()}")
        return
    _register()
    app()


if __name__ == "__main__":
    main()
