"""``--web.config.file`` on the three commands: a malformed file stops each one before it
listens, with the file and field named and no traceback (typer's runner, in-process)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

BAD = "tls_server_config:\n  cert_filse: server.crt\n"  # upstream's web_config_junk_key.yml
FIELD = "tls_server_config.cert_filse: unknown field"


def _bad(tmp_path: Path) -> Path:
    path = tmp_path / "web.yml"
    path.write_text(BAD)
    return path


def test_gpufed_exporter_serve(tmp_path: Path) -> None:
    from exporter.commands.cli import cli

    result = CliRunner().invoke(cli, ["serve", "--backend", "simulated", "--listen", "127.0.0.1:0",
                                      "--web.config.file", str(_bad(tmp_path))])
    assert result.exit_code != 0 and FIELD in result.output, result.output
    assert "Traceback" not in result.output


def test_gpufed_exporter_serve_reads_the_environment(tmp_path: Path) -> None:
    from exporter.commands.cli import cli

    result = CliRunner().invoke(cli, ["serve", "--backend", "simulated", "--listen", "127.0.0.1:0"],
                                env={"GPUFED_EXPORTER_WEB_CONFIG_FILE": str(_bad(tmp_path))})
    assert result.exit_code != 0 and FIELD in result.output, result.output


def test_gpufed_dingtalk_check(tmp_path: Path) -> None:
    from alertmanager.dingtalk.cli import cli

    relay = tmp_path / "relay.yml"
    relay.write_text("robots:\n  cn-bj:\n    url: https://oapi.dingtalk.com/robot/send?access_token=t\n")
    result = CliRunner().invoke(cli, ["--config", str(relay), "--check", "--web.config.file",
                                      str(_bad(tmp_path))])
    assert result.exit_code == 2 and FIELD in result.output, result.output
    good = tmp_path / "good.yml"
    good.write_text("http_server_config:\n  headers:\n    X-Frame-Options: deny\n")
    result = CliRunner().invoke(cli, ["--config", str(relay), "--check", "--web.config.file", str(good)])
    assert result.exit_code == 0, result.output


def test_gpufed_serve(tmp_path: Path) -> None:
    import typer

    from federation.commands import serve

    app = typer.Typer()
    serve.register(app)
    app.command("noop")(lambda: None)  # two commands: typer keeps "serve" as a subcommand
    result = CliRunner().invoke(app, ["serve", "--spec", "examples/federation.yaml", "--data-dir",
                                      str(tmp_path / "data"), "--dev", "--web.config.file",
                                      str(_bad(tmp_path))])
    assert result.exit_code == 2 and FIELD in result.output, result.output
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").iterdir())


def test_gpufed_serve_refuses_basic_auth_users(tmp_path: Path) -> None:
    """Its Authorization header carries the bearer token; basic auth there would lock out writes."""
    import typer

    from federation.commands import serve

    app = typer.Typer()
    serve.register(app)
    app.command("noop")(lambda: None)
    web = tmp_path / "web.yml"
    hashed = "$2y$10$mDwo.lAisC94iLAyP81MCesa29IzH37oigHC/42V2pdJlUprsJPze"  # upstream's alice
    web.write_text(f"basic_auth_users:\n  alice: {hashed}\n")
    result = CliRunner().invoke(app, ["serve", "--spec", "examples/federation.yaml", "--data-dir",
                                      str(tmp_path / "data"), "--dev", "--web.config.file", str(web)])
    assert result.exit_code == 2 and "basic_auth_users: gpufed serve authenticates" in result.output
