"""The demo's child router, over real HTTP on loopback (its DingTalk group is
``federation.localrun.dingtalk``: tests/localrun/test_localrun_dingtalk.py)."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from federation.demo.router import ChildRouter
from federation.localrun.loopback import LoopbackHandler, LoopbackHTTPServer


class _Targets(LoopbackHandler):
    def do_GET(self) -> None:
        self.reply(200, {"path": self.path}, content_type="application/json")


def test_router_reaches_a_child_by_name_and_refuses_unknown_ones() -> None:
    with LoopbackHTTPServer(_Targets) as child, ChildRouter() as router:
        router.set("region-0-2", child.port)
        base = router.template().format(child="region-0-2")
        answer = httpx.get(f"{base}/api/v1/targets?state=active", timeout=5)
        assert answer.status_code == 200
        assert answer.json() == {"path": "/api/v1/targets?state=active"}
        unknown = router.template().format(child="nope")
        assert httpx.get(f"{unknown}/-/ready", timeout=5).status_code == 502
        router.remove("region-0-2")
        assert httpx.get(f"{base}/-/ready", timeout=5).status_code == 502



def test_a_hung_child_whose_scraper_hung_up_first_prints_no_traceback(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A frozen child (SIGSTOP) outlasts the master's scrape timeout: the router's 502 then
    goes to a closed connection, which is no error of the router's (it printed a traceback)."""
    with socket.create_server(("127.0.0.1", 0)) as hung, ChildRouter(timeout=0.5) as router:
        router.set("region-0-0", hung.getsockname()[1])
        url = router.template().format(child="region-0-0") + "/metrics"
        with pytest.raises(httpx.TimeoutException):
            httpx.get(url, timeout=0.1)  # the scraper gives up and hangs up
        conn, _ = hung.accept()  # the router's request, never answered
        with conn:
            conn.settimeout(5)
            while conn.recv(4096):  # until the router gives up on the child
                pass
        # The router answers right after it gives up; a later request through it is served
        # after that answer was written (or failed) on the router's side.
        time.sleep(0.5)
        router.remove("region-0-0")
        assert httpx.get(router.template().format(child="region-0-0"), timeout=5).status_code == 502
    assert "Traceback" not in capfd.readouterr().err
