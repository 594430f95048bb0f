"""Our verdict on each vendored upstream file equals the real node-exporter's (1.11.1, which
reads the same format through exporter-toolkit), but for the two documented differences.

node-exporter refuses a bad file at startup and exits; a good one makes it listen. The test
CA's certificates stand in for upstream's server.crt / server.key / client_selfsigned.pem.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from federation.localrun.waiting import wait_until
from tests.conftest import stack_tool
from tests.webconfig.pki import Pki
from webconfig.model import WebConfigError
from webconfig.serving import load_web_config

UPSTREAM = Path(__file__).parent / "upstream"
# Python's ssl cannot serve it (refused by us); our servers never offer HTTP/2 (accepted by us).
DIFFERENT = {"tls_config_noAuth.requireanyclientcert.good.yml", "web_config_noAuth_noHTTP2Cipher.bad.yml"}

pytestmark = pytest.mark.e2e


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _node_exporter_accepts(config: Path) -> tuple[bool, str]:
    port = _free_port()
    process = subprocess.Popen(
        [stack_tool(3, "prometheus-node-exporter"), f"--web.listen-address=127.0.0.1:{port}",
         f"--web.config.file={config}", "--collector.disable-defaults", "--collector.loadavg"],
        cwd=config.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def settled() -> bool:
        if process.poll() is not None:
            return True
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            return False
        return True

    try:
        wait_until(settled, timeout=30, what="node-exporter to listen or exit", retry_on=())
    finally:
        listening = process.poll() is None
        process.kill()
        output, _ = process.communicate()
    return listening, output


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ne")
    (folder / "ca").mkdir()
    pki = Pki(folder / "ca")
    leaf = pki.server()
    shutil.copy(leaf.cert, folder / "server.crt")
    shutil.copy(leaf.key, folder / "server.key")
    shutil.copy(pki.ca_file, folder / "client_selfsigned.pem")
    return folder


@pytest.mark.parametrize("path", sorted(UPSTREAM.glob("*.yml")), ids=lambda p: p.name)
def test_same_verdict_as_node_exporter(path: Path, folder: Path) -> None:
    config = folder / path.name
    shutil.copy(path, config)
    theirs, output = _node_exporter_accepts(config)
    try:
        load_web_config(config)
        ours = True
    except WebConfigError:
        ours = False
    if path.name in DIFFERENT:
        assert ours != theirs, output
    else:
        assert ours == theirs, output
