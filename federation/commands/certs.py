"""``gpufed certs``: a private CA, one server and one client certificate, for the spec's ``tls``.

    gpufed certs ./certs --host child-region-0-0 --host master-prometheus --host '*.gpu.internal'

A thin command over ``webconfig.certs.make_certs`` (which ``gpufed demo --tls`` runs too): see
that module for the files written and how.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from webconfig.certs import CertsError, make_certs


def certs_command(
    out: Annotated[Path, typer.Argument(help="folder to write into (made if missing)", file_okay=False)],
    host: Annotated[list[str] | None, typer.Option(
        "--host", help="a name or IP the server certificate is valid for (repeat; localhost always)")] = None,
    client_name: Annotated[str, typer.Option(help="the client certificate's common name")] = "prometheus",
    days: Annotated[int, typer.Option(min=1, max=3650, help="validity of the leaf certificates")] = 365,
    ca_days: Annotated[int, typer.Option(min=1, max=36500, help="validity of a new CA")] = 3650,
) -> None:
    """Make a private CA (unless OUT has one) and a server and a client certificate signed by it."""
    try:
        written = make_certs(out, hosts=list(host or []), client_name=client_name, days=days, ca_days=ca_days)
    except (CertsError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    for name in written:
        typer.echo(str(out / name))


def register(app: typer.Typer) -> None:
    app.command("certs")(certs_command)
