"""The TLS cost benches run, small: what they print is what ran (issue 41 item 5).

``gpufed-exporter bench tls`` scrapes a plain and a mutual-TLS exporter; ``gpufed bench sd
--tls`` loads a plain and a mutual-TLS controller beside the floor. Figures are not asserted
(no timed asserts); that both sides answered every request over the protocol they claim is.
"""

from __future__ import annotations

import json

from typer.testing import CliRunner

from exporter.commands.cli import cli as exporter_cli
from federation.commands.cli import _register
from federation.commands.cli import app as gpufed_cli


def test_exporter_bench_tls_compares_plain_and_mutual_tls_in_one_run() -> None:
    result = CliRunner().invoke(exporter_cli, ["bench", "tls", "--gpus", "1", "--scrapes", "8",
                                               "--reconnect-scrapes", "8", "--rounds", "2", "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)["tls"]
    assert figures["ok"] is True and figures["handshake_failures"] == 0
    assert figures["tls_version"] == "TLSv1.3" and figures["cipher"]
    assert figures["client_auth"] == "RequireAndVerifyClientCert"
    for prefix in ("", "reconnect_"):
        for mode in ("plain", "tls"):
            assert figures[f"{prefix}{mode}_p99_ms"] >= figures[f"{prefix}{mode}_p50_ms"] > 0
            assert figures[f"{prefix}{mode}_cpu_ms_per_scrape"] is not None
        assert f"{prefix}tls_cpu_ratio" in figures and f"{prefix}tls_p99_ratio" in figures


def test_sd_bench_tls_loads_a_mutual_tls_controller_beside_the_plain_one() -> None:
    _register()
    runner = CliRunner()
    result = runner.invoke(gpufed_cli, ["bench", "sd", "--tls", "--targets", "40", "--shards", "2",
                                        "--pollers", "2", "--clients", "2", "--duration", "2", "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    for side in ("", "tls_"):
        assert figures[f"{side}requests"] > 0 and figures[f"{side}errors"] == 0, figures
        assert figures[f"{side}server_cpu_ms_per_request"] is not None
        assert figures[f"{side}connect_s"] >= 0
    assert figures["tls_client_auth"] == "RequireAndVerifyClientCert"
    refused = runner.invoke(gpufed_cli, ["bench", "sd", "--tls", "--abuse", "2"])
    assert refused.exit_code == 2 and "--tls" in refused.output
