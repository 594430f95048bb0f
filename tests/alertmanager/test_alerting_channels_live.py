"""A real Alertmanager 0.33.1 on gpufed's rendered channels: one critical alert reaches
WeCom, the SMS webhook and DingTalk; a warning reaches DingTalk and no pager.

The WeCom stand-in speaks WeCom's API (gettoken, then message/send with the token), so the
message arriving proves Alertmanager read the secret from ``api_secret_file`` (the stand-in
refuses any other secret with 40001 and no token). The SMS stand-in checks the bearer token
Alertmanager reads from ``credentials_file``. DingTalk is reached through the relay, as in
production.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
import pytest
from conftest import stack_tool, stop_process
from conftest import wait_for as shared_wait_for

from alertmanager.channels import WeComSpec
from alertmanager.dingtalk.app import create_app
from alertmanager.dingtalk.config import load_config
from alertmanager.models import (
    AlertingSpec,
    ReceiverSpec,
    RegionRouteSpec,
    RobotSpec,
    SeverityRoutesSpec,
    SeverityTiming,
    SeverityTimings,
    Timing,
    WebhookSpec,
)
from alertmanager.render import ALERTMANAGER_FILE, RELAY_FILE, render_alerting_bundle
from federation.localrun.dingtalk import LocalDingTalk
from federation.localrun.loopback import listening_socket
from federation.testing.harnesses.alertmanager import RelayThread, gpu_alert, loopback_replicas
from federation.testing.standins.sms import FakeSmsGateway
from federation.testing.standins.wecom import FakeWeCom

REGION, ROBOT, TOKEN = "cn-live", "live", "tok-channels-1"
CORP, AGENT, WECOM_SECRET, SMS_TOKEN = "ww-live-corp", "1000002", "wecom-app-secret-7f3a", "sms-bearer-51c9"
FAST = SeverityTiming(group_wait="1s", group_interval="2s", repeat_interval="1h")
#: ``wait_for`` stops at anything but None/False: checks here return a bool, never a list.
wait_for = partial(shared_wait_for, timeout=30.0, interval=0.1)


def spec(*, wecom_url: str, sms_url: str, dingtalk_url: str, relay_port: int, secrets: Path) -> AlertingSpec:
    return AlertingSpec(
        relay_url=f"http://127.0.0.1:{relay_port}", relay_listen=f"127.0.0.1:{relay_port}",
        replicas=loopback_replicas(1),
        timing=Timing(group_wait="1s", group_interval="2s", repeat_interval="1h"),
        severities=SeverityTimings(critical=FAST, warning=FAST, info=FAST),
        robots=[RobotSpec(name=ROBOT, url=f"{dingtalk_url}/robot/send?access_token=${{LIVE_TOKEN}}")],
        receivers=[
            ReceiverSpec(name="sre", robots=[ROBOT]),
            ReceiverSpec(name="wecom-oncall", wecom=[WeComSpec(
                corp_id=CORP, agent_id=AGENT, api_secret_file=str(secrets / "wecom"), to_user="@all",
                to_party="2", api_url=wecom_url)]),
            ReceiverSpec(name="sms", webhooks=[WebhookSpec(
                url=sms_url, send_resolved=False, credentials_file=str(secrets / "sms"))]),
        ],
        default_receiver="sre",
        routes=[RegionRouteSpec(region=REGION, robot=ROBOT)],
        severity_routes=SeverityRoutesSpec(critical=["wecom-oncall", "sms"]),
    )


@dataclass
class Stack:
    wecom: FakeWeCom
    sms: FakeSmsGateway
    dingtalk: LocalDingTalk
    url: str

    def post(self, alert: dict[str, object]) -> None:
        httpx.post(f"{self.url}/api/v2/alerts", json=[alert], timeout=10).raise_for_status()


@contextmanager
def running(tmp_path: Path, *, wecom_secret: str) -> Iterator[Stack]:
    """The stand-ins, the relay and Alertmanager 0.33.1 on the rendered config; the WeCom
    secret file holds ``wecom_secret``."""
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "wecom").write_text(wecom_secret + "\n")  # Alertmanager trims the file's whitespace
    (secrets / "sms").write_text(SMS_TOKEN)
    with FakeWeCom() as wecom, FakeSmsGateway(token=SMS_TOKEN) as sms, LocalDingTalk() as dingtalk:
        wecom.add_app(CORP, secret=WECOM_SECRET, agent_id=AGENT)
        dingtalk.add_robot(TOKEN)
        sock = listening_socket()
        alerting = spec(wecom_url=wecom.api_url, sms_url=sms.url, dingtalk_url=dingtalk.base_url,
                        relay_port=sock.getsockname()[1], secrets=secrets)
        bundle = render_alerting_bundle(alerting, cluster="live", regions=[REGION])
        for name in (ALERTMANAGER_FILE, RELAY_FILE):
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_bytes(bundle[name])
        relay = load_config(tmp_path / RELAY_FILE, env={"LIVE_TOKEN": TOKEN})
        replica = alerting.replicas[0]
        with RelayThread(create_app(relay), sock=sock), (tmp_path / "am.log").open("wb") as log:
            proc = subprocess.Popen(
                [stack_tool(3, "prometheus-alertmanager"), f"--config.file={tmp_path / ALERTMANAGER_FILE}",
                 f"--storage.path={tmp_path / 'am'}", f"--web.listen-address={replica.address}",
                 "--cluster.listen-address=", "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT)
            url = f"http://{replica.address}"
            try:
                def ready() -> bool:
                    if proc.poll() is not None:
                        raise AssertionError((tmp_path / "am.log").read_text(errors="replace"))
                    try:
                        return httpx.get(f"{url}/-/ready", timeout=1).status_code == 200
                    except httpx.HTTPError:
                        return False

                wait_for(ready, what="alertmanager 0.33.1 ready")
                yield Stack(wecom=wecom, sms=sms, dingtalk=dingtalk, url=url)
            finally:
                stop_process(proc)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with running(tmp_path, wecom_secret=WECOM_SECRET) as started:
        yield started


def test_a_critical_alert_reaches_wecom_sms_and_dingtalk(stack: Stack) -> None:
    stack.post(gpu_alert(region=REGION, node="live-n001", cluster="live", alertname="GPUFellOffBus"))
    wait_for(lambda: bool(stack.wecom.messages(CORP) and stack.sms.payloads()
                          and stack.dingtalk.messages(TOKEN)),
             what="the critical alert on WeCom, SMS and DingTalk")
    [message] = stack.wecom.messages(CORP)
    assert (message["touser"], message["toparty"], message["agentid"], message["msgtype"]) == (
        "@all", "2", AGENT, "text")
    assert "GPUFellOffBus" in message["text"]["content"]
    assert stack.wecom.apps[CORP].rejected == [] and stack.wecom.apps[CORP].token_requests == 1
    [payload] = stack.sms.payloads()
    assert payload["receiver"] == "sms" and payload["status"] == "firing"
    assert stack.sms.texts == ["[FIRING] GPUFellOffBus region=cn-live node=live-n001 gpu=0"]
    assert stack.sms.refused == []
    assert "GPUFellOffBus" in stack.dingtalk.messages(TOKEN)[0].text


def test_a_warning_reaches_dingtalk_only(stack: Stack) -> None:
    stack.post(gpu_alert(region=REGION, node="live-n002", cluster="live", alertname="GPUHot",
                         severity="warning"))
    stack.post(gpu_alert(region=REGION, node="live-n003", cluster="live", alertname="GPUFellOffBus"))
    # The critical one, posted after the warning, reaching every pager shows the pagers
    # have had their chance; DingTalk gets both.
    wait_for(lambda: bool(stack.wecom.messages(CORP) and stack.sms.payloads()
                          and len(stack.dingtalk.messages(TOKEN)) == 2), what="both alerts delivered")
    pages = [m["text"]["content"] for m in stack.wecom.messages(CORP)] + stack.sms.texts
    assert pages and all("GPUHot" not in page for page in pages)
    assert any("GPUHot" in m.text for m in stack.dingtalk.messages(TOKEN))


def test_the_secret_comes_from_the_file(tmp_path: Path) -> None:
    """The file holds another secret: WeCom refuses the token (40001), nothing reaches it,
    and the SMS page still goes out."""
    with running(tmp_path, wecom_secret="not-the-app-secret") as stack:
        stack.post(gpu_alert(region=REGION, node="live-n004", cluster="live", alertname="GPUFellOffBus"))
        wait_for(lambda: bool(stack.wecom.apps[CORP].rejected and stack.sms.payloads()),
                 what="WeCom refusing the secret, SMS delivered")
        assert stack.wecom.apps[CORP].rejected[0] == (40001, "invalid credential")
        assert stack.wecom.messages(CORP) == []
