"""Why a connection or a request was refused, by reason, counted and said once in the log.

Two kinds of refusal, each a closed set of reasons (the metric's label values, all exported
from zero so that ``increase()`` sees the first one):

- a TLS handshake that failed (``HANDSHAKE_REASONS``): the client's certificate is from a CA
  we do not trust, expired, missing where required, or otherwise bad; the client refused our
  certificate; plain HTTP sent to the TLS port; no common protocol version or cipher;
- a request refused by basic auth (``AUTH_REASONS``) or the rate limit.

``handshake_reason`` maps OpenSSL's error (its verify code for our check of the client's
certificate, else the alert or reason it raised) onto a reason; it is pure so that tests can
feed it errors from real handshakes. ``Tally`` is the thread-safe counter both kinds use;
``webconfig.metrics`` exports it.
"""

from __future__ import annotations

import ssl
import threading

HANDSHAKE_REASONS = (
    "unknown_ca",           # the client's certificate is not signed by client_ca_file
    "expired",              # the client's certificate is expired or not yet valid
    "no_client_cert",       # RequireAndVerifyClientCert, and the client sent none
    "bad_client_cert",      # any other failure of our check of the client's certificate
    "server_cert_refused",  # the client refused our certificate (its CA does not know ours, ...)
    "plain_http",           # an http:// client on the TLS port
    "protocol",             # no common TLS version or cipher suite
    "other",
)
AUTH_REASONS = ("missing", "malformed", "unknown_user", "bad_password")
RATE_LIMITED = "rate_limited"

# OpenSSL's X509_V_ERR_* codes (x509_vfy.h) for the check of the client's certificate.
_UNKNOWN_CA = {2, 18, 19, 20, 21}  # no issuer, self-signed, not in client_ca_file
_EXPIRED = {9, 10}  # not yet valid, expired
# OpenSSL reason names (ssl.SSLError.reason).
_SERVER_CERT_REFUSED = {
    "TLSV1_ALERT_UNKNOWN_CA", "SSLV3_ALERT_BAD_CERTIFICATE", "SSLV3_ALERT_CERTIFICATE_EXPIRED",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN", "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
    "SSLV3_ALERT_CERTIFICATE_REVOKED", "TLSV1_ALERT_ACCESS_DENIED",
}
_PROTOCOL = {
    "UNSUPPORTED_PROTOCOL", "NO_PROTOCOLS_AVAILABLE", "WRONG_VERSION_NUMBER", "VERSION_TOO_LOW",
    "VERSION_TOO_HIGH", "TLSV1_ALERT_PROTOCOL_VERSION", "NO_SHARED_CIPHER", "NO_CIPHERS_AVAILABLE",
    "SSLV3_ALERT_HANDSHAKE_FAILURE", "NO_SUITABLE_SIGNATURE_ALGORITHM", "NO_SHARED_GROUPS",
}
_NO_CLIENT_CERT = {"PEER_DID_NOT_RETURN_A_CERTIFICATE", "TLSV13_ALERT_CERTIFICATE_REQUIRED"}


def handshake_reason(exc: ssl.SSLError) -> str:
    """The reason label for a failed server-side handshake."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        code = exc.verify_code
        if code in _UNKNOWN_CA:
            return "unknown_ca"
        if code in _EXPIRED:
            return "expired"
        return "bad_client_cert"
    reason = exc.reason or ""
    if reason in _NO_CLIENT_CERT:
        return "no_client_cert"
    if reason in _SERVER_CERT_REFUSED:
        return "server_cert_refused"
    if reason == "HTTP_REQUEST":
        return "plain_http"
    if reason in _PROTOCOL:
        return "protocol"
    return "other"


_SAYS = {
    "unknown_ca": "the client's certificate is not signed by client_ca_file",
    "expired": "the client's certificate is outside its validity period",
    "no_client_cert": "the client sent no certificate, and client_auth_type requires one",
    "bad_client_cert": "the client's certificate failed verification",
    "server_cert_refused": "the client refused this server's certificate (check its CA file and "
                           "server name)",
    "plain_http": "plain HTTP on the TLS port (the client needs https)",
    "protocol": "no TLS version or cipher suite in common",
    "other": "the handshake failed",
}


def handshake_detail(exc: ssl.SSLError) -> str:
    """One line: what the reason means, then OpenSSL's own words (without ``[SSL: ...]`` noise)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        said = f"{exc.verify_message} (verify code {exc.verify_code})"
    else:
        said = (exc.reason or type(exc).__name__).lower().replace("_", " ")
    return f"{_SAYS[handshake_reason(exc)]}; OpenSSL: {said}"


class Tally:
    """Counts by reason from a closed set, under a lock (the edges count from their threads).
    ``total`` grows with every count: the exporter keys its render cache on it."""

    def __init__(self, reasons: tuple[str, ...]) -> None:
        self.reasons = reasons
        self._counts = dict.fromkeys(reasons, 0)
        self._lock = threading.Lock()
        self.total = 0

    def add(self, reason: str) -> None:
        with self._lock:
            self._counts[reason] += 1  # KeyError: a reason outside the set is a bug here
            self.total += 1

    def __getitem__(self, reason: str) -> int:
        return self._counts[reason]

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)
