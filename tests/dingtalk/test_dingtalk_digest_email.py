"""The e-mail digest (``digest.email``): a period's info alerts as one e-mail, through a real
SMTP server in-process (aiosmtpd), on the relay's fake clock.

Seed 002 sends info alerts to a weekly e-mail digest. The relay's digest already batches
them per robot for DingTalk; with ``email`` set it also keeps one batch of every robot's
info alerts (each alert once) and hands it to the smarthost when the period ends. What the
smarthost does not take stays for the next try, as a DingTalk digest does.
"""

from __future__ import annotations

import email
import email.policy
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alertmanager.dingtalk import digest, mail, memory
from alertmanager.dingtalk.app import flush_digests
from alertmanager.dingtalk.config import DigestEmailConfig
from alertmanager.dingtalk.errors import ConfigError
from federation.localrun.loopback import free_port
from webconfig.certs import make_certs

from .payloads import relay_config
from .test_dingtalk_digest import DAY, MONDAY, WEEK, DingTalk, FakeClock, critical, info, post, run

USER, PASSWORD = "gpufed", "smtp-pass-7f3a"


class Inbox:
    """aiosmtpd's handler: every message the server accepted, parsed. ``refuse``: recipient ->
    the reply its RCPT gets instead of 250 (a 4xx defers it, a 5xx refuses it for good)."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, list[str], email.message.EmailMessage]] = []
        self.refuse: dict[str, str] = {}

    async def handle_RCPT(self, server: SMTP, session: Session, envelope: Envelope, address: str,
                          rcpt_options: list[str]) -> str:
        if address in self.refuse:
            return self.refuse[address]
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        content = envelope.content if isinstance(envelope.content, bytes) else str(envelope.content).encode()
        parsed = email.message_from_bytes(content, policy=email.policy.default)
        assert isinstance(parsed, email.message.EmailMessage)
        self.messages.append((str(envelope.mail_from), list(envelope.rcpt_tos), parsed))
        return "250 OK"


def _login(server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any) -> AuthResult:
    ok = isinstance(data, LoginPassword) and (data.login, data.password) == (USER.encode(), PASSWORD.encode())
    return AuthResult(success=ok, handled=False)  # aiosmtpd answers 535 itself


class SmtpServer:
    """An SMTP server on loopback: plain, or with STARTTLS (``tls``), login optional."""

    def __init__(self, *, tls: ssl.SSLContext | None = None, port: int | None = None) -> None:
        self.inbox = Inbox()
        self.port = port or free_port()
        self.controller = Controller(self.inbox, hostname="127.0.0.1", port=self.port, tls_context=tls,
                                     require_starttls=tls is not None, authenticator=_login,
                                     auth_require_tls=tls is not None,
                                     auth_exclude_mechanism=["LOGIN"])  # PLAIN, as most relays offer

    def __enter__(self) -> SmtpServer:
        self.controller.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.controller.stop()


@pytest.fixture
def smtp() -> Iterator[SmtpServer]:
    with SmtpServer() as server:
        yield server


def email_digest(port: int, **changes: Any) -> dict[str, Any]:
    return {"period": "7d", "email": {
        "to": ["sre@example.com", "gpu-team@example.com"], "from": "gpufed@example.com",
        "smarthost": f"127.0.0.1:{port}", "require_tls": False, "auth_username": USER,
        "auth_password": PASSWORD, **changes}}


def test_a_week_of_info_alerts_is_one_email_listing_each_alert_once(smtp: SmtpServer, tmp_path: Path) -> None:
    api, clock = DingTalk(), FakeClock(MONDAY + 3600)

    async def scenario(client: httpx.AsyncClient, app: FastAPI) -> None:
        relay = app.state.relay
        for day in range(3):
            clock.now = MONDAY + 3600 + day * DAY
            assert await post(client, [info(day)], group=f"info-{day}") == "digested"
            assert await post(client, [info(day)], group=f"info-{day}") == "digested"  # the HA copy
        assert await post(client, [critical(9)], group="crit") == "sent"  # never in a digest
        clock.now = MONDAY + WEEK - 1
        assert await flush_digests(relay) == 0 and smtp.inbox.messages == []
        clock.now = MONDAY + WEEK + 30
        assert await flush_digests(relay) == 2  # the robot's message and the e-mail
        assert await flush_digests(relay) == 0

    run(api, clock, scenario, data_dir=tmp_path, relay=relay_config(digest=email_digest(smtp.port)))
    [(sender, recipients, message)] = smtp.inbox.messages
    assert sender == "gpufed@example.com" and recipients == ["sre@example.com", "gpu-team@example.com"]
    assert message["Subject"] == "[gpufed] 3 info alert(s), 2024-05-06 09:00 to 2024-05-13 09:00"
    body = message.get_content()
    assert "3 info alert(s) from 2024-05-06 09:00 to 2024-05-13 09:00 (Asia/Shanghai): 3 still firing" in body
    for day in range(3):
        assert body.count(f"- GPUIdle{day} ") == 1 and f"node=node-{day:04d}" in body
    assert "GPUXidError" not in body and "**" not in body  # plain text, no markdown
    assert len(api.digests()) == 1  # DingTalk still gets its own digest
    assert memory.load(tmp_path).digest == {}


def test_a_smarthost_that_is_down_keeps_the_batch_for_the_next_try() -> None:
    api, clock = DingTalk(), FakeClock(MONDAY + DAY)
    port = free_port()
    server = SmtpServer(port=port)

    async def scenario(client: httpx.AsyncClient, app: FastAPI) -> None:
        relay = app.state.relay
        assert await one_info_alert_week(client, relay, clock) == 1  # DingTalk's; the e-mail failed
        assert relay.digests.pending(digest.EMAIL) is not None
        assert relay.metrics.digest_email_failures._value.get() == 1
        assert await post(client, [info(2)], group="g2") == "digested"  # joins the batch that failed
        with server:
            assert await flush_digests(relay) == 1
        assert relay.digests.pending(digest.EMAIL) is None

    run(api, clock, scenario, relay=relay_config(digest=email_digest(port)))
    [(_, _, message)] = server.inbox.messages
    assert "GPUIdle1" in message.get_content() and "GPUIdle2" in message.get_content()


def refused_recipients(relay: Any, outcome: str) -> float:
    return float(relay.metrics.digest_email_refused.labels(outcome)._value.get())


async def one_info_alert_week(client: httpx.AsyncClient, relay: Any, clock: FakeClock) -> int:
    """info(1) digested, then the week's end: what the flush sent (DingTalk's digest is one)."""
    assert await post(client, [info(1)]) == "digested"
    clock.now = MONDAY + WEEK + 1
    return await flush_digests(relay)


def test_a_recipient_the_smarthost_defers_gets_the_same_digest_alone_on_the_next_try(
        smtp: SmtpServer, tmp_path: Path) -> None:
    api, clock = DingTalk(), FakeClock(MONDAY + DAY)
    smtp.inbox.refuse["gpu-team@example.com"] = "450 4.2.1 Mailbox busy, try later"
    retry = digest.email_retry(["gpu-team@example.com"])

    async def scenario(client: httpx.AsyncClient, app: FastAPI) -> None:
        relay = app.state.relay
        assert await one_info_alert_week(client, relay, clock) == 2  # DingTalk's, and the e-mail sre@ got
        assert relay.digests.pending(retry) is not None and relay.digests.pending(digest.EMAIL) is None
        assert refused_recipients(relay, "deferred") == 1 and refused_recipients(relay, "final") == 0
        assert retry in memory.load(tmp_path).digest  # a restart keeps the retry
        assert await post(client, [info(2)], group="g2") == "digested"  # the next period's batch
        assert await flush_digests(relay) == 0  # deferred again: still kept, nobody else mailed
        assert relay.digests.pending(retry) is not None
        del smtp.inbox.refuse["gpu-team@example.com"]
        assert await flush_digests(relay) == 1
        assert relay.digests.pending(retry) is None
        assert relay.digests.pending(digest.EMAIL) is not None  # info(2) waits for its own period

    run(api, clock, scenario, data_dir=tmp_path, relay=relay_config(digest=email_digest(smtp.port)))
    [(_, first, mailed), (_, second, again)] = smtp.inbox.messages
    assert (first, second) == (["sre@example.com"], ["gpu-team@example.com"])
    assert again.get_content() == mailed.get_content() and again["Subject"] == mailed["Subject"]
    assert "GPUIdle1" in again.get_content() and "GPUIdle2" not in again.get_content()
    assert again["To"] == "sre@example.com, gpu-team@example.com"  # as first addressed


def test_a_recipient_refused_for_good_is_counted_and_not_tried_again(smtp: SmtpServer) -> None:
    api, clock = DingTalk(), FakeClock(MONDAY + DAY)
    smtp.inbox.refuse["gpu-team@example.com"] = "550 5.1.1 No such user"

    async def scenario(client: httpx.AsyncClient, app: FastAPI) -> None:
        relay = app.state.relay
        assert await one_info_alert_week(client, relay, clock) == 2
        assert refused_recipients(relay, "final") == 1 and refused_recipients(relay, "deferred") == 0
        assert relay.digests.pending(digest.email_retry(["gpu-team@example.com"])) is None
        assert relay.digests.pending(digest.EMAIL) is None
        assert relay.metrics.digest_email_failures._value.get() == 0

    run(api, clock, scenario, relay=relay_config(digest=email_digest(smtp.port)))
    [(_, recipients, _)] = smtp.inbox.messages
    assert recipients == ["sre@example.com"]


def test_when_every_recipient_is_deferred_the_batch_stays_whole_with_what_comes_next(
        smtp: SmtpServer) -> None:
    api, clock = DingTalk(), FakeClock(MONDAY + DAY)
    smtp.inbox.refuse.update({"sre@example.com": "451 4.7.1 Greylisted",
                              "gpu-team@example.com": "452 4.2.2 Mailbox full"})

    async def scenario(client: httpx.AsyncClient, app: FastAPI) -> None:
        relay = app.state.relay
        assert await one_info_alert_week(client, relay, clock) == 1  # DingTalk's only
        assert relay.metrics.digest_email_failures._value.get() == 1
        assert refused_recipients(relay, "deferred") == 2
        assert relay.digests.pending(digest.EMAIL) is not None  # under its own key: it merges
        assert await post(client, [info(2)], group="g2") == "digested"
        smtp.inbox.refuse.clear()
        assert await flush_digests(relay) == 1

    run(api, clock, scenario, relay=relay_config(digest=email_digest(smtp.port)))
    [(_, recipients, message)] = smtp.inbox.messages
    assert recipients == ["sre@example.com", "gpu-team@example.com"]
    assert "GPUIdle1" in message.get_content() and "GPUIdle2" in message.get_content()


def test_a_retry_for_a_recipient_taken_out_of_the_config_is_dropped(smtp: SmtpServer) -> None:
    api, clock = DingTalk(), FakeClock(MONDAY + DAY)
    smtp.inbox.refuse["gpu-team@example.com"] = "450 4.2.1 Mailbox busy"
    retry = digest.email_retry(["gpu-team@example.com"])

    async def scenario(client: httpx.AsyncClient, app: FastAPI) -> None:
        relay = app.state.relay
        assert await one_info_alert_week(client, relay, clock) == 2
        assert relay.digests.pending(retry) is not None
        relay.config = relay_config(digest=email_digest(smtp.port, to=["sre@example.com"]))
        smtp.inbox.refuse.clear()
        assert await flush_digests(relay) == 0
        assert relay.digests.pending(retry) is None
        relay.config = relay_config(digest=None)  # no e-mail at all: nothing of it is kept
        relay.digests.give_back(retry, digest.Batch(opened=clock.now, due=clock.now))
        await flush_digests(relay)
        assert relay.digests.pending(retry) is None

    run(api, clock, scenario, relay=relay_config(digest=email_digest(smtp.port)))
    assert [recipients for _, recipients, _ in smtp.inbox.messages] == [["sre@example.com"]]


def test_a_wrong_password_is_refused_naming_the_user_never_the_password(smtp: SmtpServer) -> None:
    config = DigestEmailConfig.model_validate(
        {**email_digest(smtp.port)["email"], "auth_password": "not-the-password"})
    with pytest.raises(mail.MailError) as refused:
        mail.send(config, mail.message(config, subject="s", body="b"))
    assert "refused the login of 'gpufed'" in refused.value.detail
    assert "not-the-password" not in refused.value.detail and smtp.inbox.messages == []


def test_require_tls_sends_over_starttls_and_refuses_a_server_without_it(
        smtp: SmtpServer, tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    make_certs(certs, hosts=["127.0.0.1"], client_name="relay", days=1, ca_days=1)
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(certs / "server.crt", certs / "server.key")
    trusted = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    plain = DigestEmailConfig.model_validate({**email_digest(smtp.port)["email"], "require_tls": True})
    with pytest.raises(mail.MailError, match="offers no STARTTLS and require_tls is true"):
        mail.send(plain, mail.message(plain, subject="s", body="b"), context=trusted)
    assert smtp.inbox.messages == []
    with SmtpServer(tls=served) as secure:
        config = DigestEmailConfig.model_validate({**email_digest(secure.port)["email"], "require_tls": True})
        assert mail.send(config, mail.message(config, subject="over TLS", body="b"), context=trusted) == {}
        with pytest.raises(mail.MailError, match="not reachable"):  # a CA it does not trust
            mail.send(config, mail.message(config, subject="s", body="b"),
                      context=ssl.create_default_context())
    [(_, _, message)] = secure.inbox.messages
    assert message["Subject"] == "over TLS"


@pytest.mark.parametrize(("change", "message"), [
    ({"to": ["sre at example.com"]},
     "digest.email.to.0: Value error, must be an address like ops@example.com, got 'sre at example.com'"),
    ({"to": []}, "to"),
    ({"from": "gpufed@example.com\r\nBcc: x@y.z"}, "digest.email.from: Value error, must be an address"),
    ({"smarthost": "smtp.example.com"}, "smarthost must be host:port"),
    ({"smarthost": "smtp.example.com:70000"}, "smarthost must be host:port"),
    ({"auth_password": None}, "email.auth_username and email.auth_password go together"),
    ({"auth_password": "changeme"}, "email.auth_password is a placeholder"),
    ({"bcc": ["x@example.com"]}, "bcc"),
])
def test_bad_email_settings_are_refused_naming_the_field(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        relay_config(digest=email_digest(25, **change))
    assert message in str(refused.value)
    assert "smtp-pass-7f3a" not in str(refused.value)


_GARBAGE = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=300),
    st.binary(max_size=64).map(lambda b: b.decode("latin-1")), st.lists(st.text(max_size=40), max_size=5),
    st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=3),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(["to", "from", "smarthost", "require_tls", "auth_username", "auth_password",
                              "timeout", "unknown"]),
       value=_GARBAGE)
def test_any_value_in_any_email_field_loads_or_is_one_clear_config_error(field: str, value: Any) -> None:
    try:
        relay_config(digest=email_digest(25, **{field: value}))
    except ConfigError as refused:
        assert "digest.email" in str(refused) and "smtp-pass-7f3a" not in str(refused)
