"""The relay's SMTP client: one e-mail per digest (``digest.email``).

Blocking ``smtplib`` behind one function, run in a worker thread by the app: a digest is one
message a period, so a connection per message costs nothing worth pooling. STARTTLS is
required unless ``require_tls`` is false (as Alertmanager's ``email_configs``); the server's
certificate is checked against the system's roots.
"""

from __future__ import annotations

import smtplib
import ssl
from collections.abc import Sequence
from email.message import EmailMessage
from email.utils import formatdate, make_msgid

from alertmanager.dingtalk.config import DigestEmailConfig


class MailError(Exception):
    """The message was not handed to the smarthost; ``detail`` says why (never the password)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def message(config: DigestEmailConfig, *, subject: str, body: str) -> EmailMessage:
    """A plain-text UTF-8 message from ``config.sender`` to every ``config.to``."""
    mail = EmailMessage()
    mail["From"] = config.sender
    mail["To"] = ", ".join(config.to)
    mail["Subject"] = subject
    mail["Date"] = formatdate(localtime=False)
    mail["Message-ID"] = make_msgid(domain=config.sender.rsplit("@", 1)[1])
    mail.set_content(body)
    return mail


def temporary(code: int) -> bool:
    """A 4xx reply to RCPT (mailbox busy, greylisting, a quota): the same recipient may be tried
    again later. A 5xx one is final."""
    return 400 <= code < 500


def send(
    config: DigestEmailConfig, mail: EmailMessage, *, to: Sequence[str] | None = None,
    context: ssl.SSLContext | None = None,
) -> dict[str, int]:
    """Hand ``mail`` to the smarthost for ``to`` (default: every ``config.to``), or raise
    ``MailError`` when it took the message for nobody for a reason other than the recipients.

    Returns the recipients the smarthost refused, with its reply code: it took the message for
    every other one (when all were refused, for nobody). ``context``: the STARTTLS client
    context (default: the system's roots)."""
    host, _, port = config.smarthost.rpartition(":")
    try:
        with smtplib.SMTP(host.strip("[]"), int(port), timeout=config.timeout) as smtp:
            smtp.ehlo()
            if config.require_tls:
                if not smtp.has_extn("starttls"):
                    raise MailError(f"{config.smarthost} offers no STARTTLS and require_tls is true")
                smtp.starttls(context=context or ssl.create_default_context())
                smtp.ehlo()
            if config.auth_username is not None and config.auth_password is not None:
                smtp.login(config.auth_username, config.auth_password.get_secret_value())
            try:
                refused = smtp.send_message(mail, to_addrs=list(to) if to is not None else None)
            except smtplib.SMTPRecipientsRefused as exc:  # every recipient refused
                refused = exc.recipients
    except smtplib.SMTPAuthenticationError as exc:
        raise MailError(
            f"{config.smarthost} refused the login of {config.auth_username!r}: {exc.smtp_code}") from exc
    except smtplib.SMTPException as exc:
        raise MailError(f"{config.smarthost}: {type(exc).__name__}: {exc}") from exc
    except (OSError, ssl.SSLError) as exc:
        raise MailError(f"{config.smarthost} not reachable: {exc}") from exc
    return {str(address): int(code) for address, (code, _) in sorted(refused.items())}
