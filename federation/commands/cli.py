"""The ``gpufed`` command line: thin commands over the same core functions REST uses.

Each command group lives in its own module under ``federation.commands`` and is
registered here; nothing runs at import time.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="gpufed",
    help="Sharded federation control plane for GPU-cluster monitoring.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(help="Benchmarks that print figures (JSON with --json).", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


def _register() -> None:
    # Imported here so that importing federation.commands.cli stays cheap and side-effect free.
    from federation.commands import (
        bench,
        bench_balance,
        bench_controller,
        bench_demo,
        bench_discovery,
        bench_failover,
        bench_live,
        demo,
        render,
        serve,
        watch,
    )

    render.register(app)
    bench.register(bench_app)
    watch.register(app)
    serve.register(app)
    bench_discovery.register(bench_app)
    bench_controller.register(bench_app)
    bench_failover.register(bench_app)
    bench_balance.register(bench_app)
    bench_demo.register(bench_app)
    bench_live.register(bench_app)
    demo.register(app)


def main() -> None:
    _register()
    app()


if __name__ == "__main__":
    main()
