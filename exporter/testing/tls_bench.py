"""`gpufed-exporter bench tls`: what serving TLS with client certificates costs a scrape.

What is measured, honestly: two exporters run in this process, one plain and one with a
``--web.config.file`` that requires and verifies client certificates (a private CA made for
the run by ``webconfig.testing``), and take turns under the same scrapes, ``rounds`` times
each, so a neighbour's burst on this machine lands on both. Renders are cold (the render
cache off), as in production where each scrape follows a new collection. Two connection
shapes: keep-alive, as Prometheus scrapes (one handshake per connection, then only record
encryption), and a new connection per scrape (a full mutual-TLS handshake each: the worst
case, e.g. a Prometheus whose scrapes time out and reconnect). Latency is the client's wall
time, which includes its own TLS work; server CPU per scrape is process CPU minus the client
thread's, as in ``exporter.testing.bench``.
"""

from __future__ import annotations

import http.client
import os
import ssl
import tempfile
from pathlib import Path
from typing import Any

from exporter.app import ExporterApp
from exporter.errors import ConfigError
from exporter.settings import ExporterSettings
from exporter.testing.bench import latency_figures, scrape_times

MODES = ("plain", "tls")
SHAPES = ("keepalive", "reconnect")


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def bench_tls(*, gpus: int = 8, scrapes: int = 2000, reconnect_scrapes: int = 400,
              rounds: int = 4) -> dict[str, Any]:
    try:
        from webconfig.testing import Pki
    except ImportError as exc:
        raise ConfigError(f"the TLS bench makes its certificates with the cryptography package "
                          f"(requirements/dev.txt): {exc}") from exc
    with tempfile.TemporaryDirectory(prefix="gpufed-bench-tls-") as tmp:
        folder = Path(tmp)
        pki = Pki(folder)
        client = pki.client()
        web = pki.web_config(folder / "web.yml", server=pki.server())
        context = ssl.create_default_context(cafile=str(pki.ca_file))
        context.load_cert_chain(str(client.cert), str(client.key))

        def https(port: int) -> http.client.HTTPConnection:
            return http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)

        apps = {mode: ExporterApp(ExporterSettings(
            backend="simulated", gpus=gpus, listen="127.0.0.1:0", node_name="bench-node",
            collect_interval=5.0, web_config_file=web if mode == "tls" else None)) for mode in MODES}
        latencies: dict[tuple[str, str], list[float]] = {(m, s): [] for m in MODES for s in SHAPES}
        cpu = dict.fromkeys(latencies, 0.0)
        size = 0
        for app in apps.values():
            app.start()
            app.routes.cache = False
        try:
            for _ in range(rounds):
                for shape, count in (("keepalive", scrapes), ("reconnect", reconnect_scrapes)):
                    for mode in MODES:
                        taken, seconds, size = scrape_times(
                            apps[mode].http.port, lambda _: "/metrics", max(1, count // rounds),
                            connect=https if mode == "tls" else None, reconnect=shape == "reconnect",
                            warmup=10)
                        latencies[mode, shape] += taken
                        cpu[mode, shape] += seconds
            probe = https(apps["tls"].http.port)
            probe.request("GET", "/healthz")
            probe.getresponse().read()
            sock = probe.sock
            version, cipher = (sock.version(), sock.cipher()) if isinstance(sock, ssl.SSLSocket) else (
                None, None)
            probe.close()
            tls = apps["tls"].served.tls
            failures = tls.handshake_failures.total if tls is not None else -1
        finally:
            for app in apps.values():
                app.stop()
    out: dict[str, Any] = {"gpus": gpus, "scrapes": scrapes, "reconnect_scrapes": reconnect_scrapes,
                           "rounds": rounds, "body_bytes": size, "tls_version": version,
                           "cipher": cipher[0] if cipher else None,
                           "client_auth": "RequireAndVerifyClientCert", "handshake_failures": failures,
                           "cpus": os.cpu_count(), "loadavg_1m": round(os.getloadavg()[0], 2)}
    for shape in SHAPES:
        prefix = "" if shape == "keepalive" else "reconnect_"
        per_scrape: dict[str, float] = {}
        for mode in MODES:
            figures = latency_figures(latencies[mode, shape])
            for key, value in figures.items():
                out[f"{prefix}{mode}_{key}"] = value
            per_scrape[mode] = cpu[mode, shape] / len(latencies[mode, shape]) * 1000
            out[f"{prefix}{mode}_cpu_ms_per_scrape"] = round(per_scrape[mode], 4)
        out[f"{prefix}tls_p99_ratio"] = _ratio(out[f"{prefix}tls_p99_ms"], out[f"{prefix}plain_p99_ms"])
        out[f"{prefix}tls_cpu_ratio"] = _ratio(per_scrape["tls"], per_scrape["plain"])
    out["ok"] = failures == 0
    return out
