"""``gpufed-dingtalk --config FILE [--listen HOST:PORT] [--data-dir DIR]``: run the relay under uvicorn.

The CLI is the only place that touches process state: it installs the SIGHUP handler
(``reload_config`` on the running loop) and owns the uvicorn server.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer
import uvicorn

import webconfig.model
import webconfig.serving
from alertmanager.dingtalk.app import create_app, reload_config
from alertmanager.dingtalk.client import redact
from alertmanager.dingtalk.config import load_config
from alertmanager.dingtalk.errors import ConfigError

cli = typer.Typer(add_completion=False, help="Relay Alertmanager webhooks to DingTalk custom robots.",
                  rich_markup_mode=None)


class RedactFilter(logging.Filter):
    """httpx logs every request URL at INFO, and a robot URL carries its access_token and sign."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = redact(record.getMessage()), None
        return True


def parse_listen(listen: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:8060`` for IPv6) -> (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise typer.BadParameter(f"expected HOST:PORT, got {listen!r}", param_hint="--listen")
    return host.strip("[]") or "0.0.0.0", int(port)


@cli.command()
def run(
    config: Annotated[Path, typer.Option("--config", "-c", help="Relay config YAML.", exists=True,
                                         dir_okay=False)],
    listen: Annotated[str | None, typer.Option(help="HOST:PORT; default: `listen` in the config.")] = None,
    check: Annotated[bool, typer.Option("--check", help="Validate the config and exit.")] = False,
    log_level: Annotated[str, typer.Option(help="Python/uvicorn log level.")] = "info",
    web_config_file: Annotated[Path | None, typer.Option(
        "--web.config.file", help="exporter-toolkit web config: TLS (reloaded on change), basic auth, "
        "headers")] = None,
    data_dir: Annotated[Path | None, typer.Option(
        "--data-dir", file_okay=False,
        help="Keep the ordering and dedup memory in DIR/relay-memory.json, so a restart remembers"
             " which state of each alert DingTalk last showed; default: memory only.")] = None,
) -> None:
    """Serve ``POST /dingtalk/{robot}/send``, ``/metrics``, ``/healthz``, ``/readyz``."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactFilter())
    try:
        relay_config = load_config(config)
    except ConfigError as exc:
        typer.echo(f"gpufed-dingtalk: {exc.detail}", err=True)
        raise typer.Exit(2) from exc
    try:
        served = webconfig.serving.load_web_config(web_config_file)
    except webconfig.model.WebConfigError as exc:
        typer.echo(f"gpufed-dingtalk: --web.config.file: {exc.detail}", err=True)
        raise typer.Exit(2) from exc
    if check:
        typer.echo(f"config OK: robots {', '.join(sorted(relay_config.robots))}")
        return
    host, port = parse_listen(listen or relay_config.listen)
    app = create_app(relay_config, data_dir=data_dir)
    app.state.relay.registry.register(served.collector())
    uv_config = uvicorn.Config(served.wrap(app), host=host, port=port, log_level=log_level.lower())
    webconfig.serving.for_uvicorn(uv_config, served)
    server = uvicorn.Server(uv_config)

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGHUP, reload_config, app.state.relay, config)
        await server.serve()

    asyncio.run(serve())


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("gpufed")
    except metadata.PackageNotFoundError:
        return "unknown"


def main() -> None:
    # One command, so no group to hang a --version option on: answered before typer parses.
    if sys.argv[1:] == ["--version"]:
        typer.echo(f"gpufed-dingtalk {_version()}")
        return
    cli()
