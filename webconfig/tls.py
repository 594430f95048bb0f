"""``tls_server_config`` -> a server ``ssl.SSLContext`` that picks up rotated certificates.

Rotation without a restart: the context's SNI callback, which OpenSSL (1.1.1 and later) runs
on every ClientHello, with or without a server name, stats the certificate, key and client CA
files; when one changed (mtime or size), a fresh context is built from the files and the
connection being accepted is switched to it (``SSLObject.context = ...``), as are all later
ones. A half-written rotation that fails to load keeps the previous certificate and is
retried on the next connection. Mutating a live context is avoided on purpose: the fresh one
also drops a removed client CA, which ``load_verify_locations`` on the old one cannot.

Refusals: the listening context makes its connections from ``_CountingSSLObject``, whose
``do_handshake`` counts a failed handshake by reason (``webconfig.refusals``) in
``ReloadingContext.handshake_failures`` and logs one line. asyncio (the exporter's edge and
uvicorn) makes every server connection with ``SSLContext.wrap_bio``, which builds
``sslobject_class``; it logs a failed handshake itself only in debug mode.

What Go's crypto/tls accepts and Python's ``ssl`` cannot express (refused here, field named):

- ``client_auth_type: RequestClientCert`` / ``RequireAnyClientCert``: Python verifies every
  client certificate it asks for against a CA; "ask, accept anything" does not exist. Use
  ``VerifyClientCertIfGiven`` / ``RequireAndVerifyClientCert`` with ``client_ca_file``.
- ``client_allowed_sans``: the peer certificate is not available where the check would go.
- inline ``cert`` / ``key``: ``load_cert_chain`` reads files only (inline ``client_ca`` works).

Approximated (accepted, documented): ``curve_preferences`` sets one group, the first listed
(``set_ecdh_curve``; Python 3.11 has no group list); TLS 1.3 cipher suites in
``cipher_suites`` are accepted and not restricted (Go does not restrict them either);
``http_server_config.http2`` is accepted but our servers speak HTTP/1.1 only.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from collections.abc import Callable
from pathlib import Path

from webconfig.model import CIPHER_SUITES, CURVES, TLSServerConfig, WebConfigError
from webconfig.refusals import HANDSHAKE_REASONS, Tally, handshake_detail, handshake_reason

log = logging.getLogger(__name__)

_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_VERIFY = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
Stamp = tuple[tuple[int, int, int] | None, ...]


def file_stamps(paths: tuple[Path | None, ...]) -> Stamp:
    """What a reload compares: each file's inode, mtime and size (None: absent or unset).

    The inode too: rotations replace files by rename (cert-manager, `mv`, kubelet's ..data
    symlink swap), which a coarse mtime alone might miss."""
    out: list[tuple[int, int, int] | None] = []
    for path in paths:
        try:
            st = os.stat(path) if path is not None else None
        except OSError:
            st = None
        out.append((st.st_ino, st.st_mtime_ns, st.st_size) if st is not None else None)
    return tuple(out)


def _resolve(name: str | None, base: Path) -> Path | None:
    if name is None:
        return None
    path = Path(name)
    return path if path.is_absolute() else base / path


def _check_expressible(tls: TLSServerConfig) -> None:
    if tls.client_auth_type not in _VERIFY:
        raise WebConfigError(
            f"tls_server_config.client_auth_type: {tls.client_auth_type} cannot be served by Python's ssl "
            "(it verifies every client certificate it asks for); use VerifyClientCertIfGiven or "
            "RequireAndVerifyClientCert with client_ca_file")
    if tls.client_allowed_sans:
        raise WebConfigError("tls_server_config.client_allowed_sans: not supported by gpufed's servers; "
                             "issue client certificates from a CA that only signs allowed clients")
    if tls.cert is not None or tls.key is not None:
        field = "cert" if tls.cert is not None else "key"
        raise WebConfigError(f"tls_server_config.{field}: inline certificates and keys are not supported "
                             f"(Python's ssl loads them from files); use {field}_file")


def _counting(on_failure: Callable[[ssl.SSLError], None]) -> type[ssl.SSLObject]:
    class _CountingSSLObject(ssl.SSLObject):
        def do_handshake(self) -> None:
            try:
                super().do_handshake()
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                raise  # not a failure: the handshake waits for the peer's next bytes
            except ssl.SSLError as exc:
                on_failure(exc)
                raise

    return _CountingSSLObject


class ReloadingContext:
    """The listening socket's ``context``; ``current`` is the one new connections get."""

    def __init__(self, tls: TLSServerConfig, *, base: Path) -> None:
        _check_expressible(tls)
        self._tls = tls
        self._cert = _resolve(tls.cert_file, base)
        self._key = _resolve(tls.key_file, base)
        self._ca = _resolve(tls.client_ca_file, base)
        self._lock = threading.Lock()
        self._stamp = self._stamps()
        self.reloads = 0
        self.handshake_failures = Tally(HANDSHAKE_REASONS)
        # Errors here are the startup's: raised, field named. `context` listens; `current` serves.
        self.context = self.current = self._build()
        self.context.sni_callback = self._on_hello
        self.context.sslobject_class = _counting(self._on_failure)

    def _stamps(self) -> Stamp:
        return file_stamps((self._cert, self._key, self._ca))

    def _build(self) -> ssl.SSLContext:
        tls = self._tls
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = _VERSIONS[tls.min_version]
        ctx.maximum_version = _VERSIONS[tls.max_version]
        tls12 = [CIPHER_SUITES[name] for name in tls.cipher_suites or [] if CIPHER_SUITES[name]]
        if tls12:
            try:
                ctx.set_ciphers(":".join(n for n in tls12 if n))
            except ssl.SSLError as exc:
                raise WebConfigError(f"tls_server_config.cipher_suites: this OpenSSL offers none of "
                                     f"{tls.cipher_suites}: {exc}") from exc
        if tls.prefer_server_cipher_suites:
            ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
        else:
            ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
        if tls.curve_preferences:
            ctx.set_ecdh_curve(CURVES[tls.curve_preferences[0]])
        ctx.verify_mode = _VERIFY[tls.client_auth_type]
        if self._ca is not None:
            try:
                ctx.load_verify_locations(cafile=str(self._ca))
            except (OSError, ssl.SSLError) as exc:
                raise WebConfigError(f"tls_server_config.client_ca_file: cannot load {str(self._ca)!r}: "
                                     f"{exc}") from exc
        elif tls.client_ca is not None:
            try:
                ctx.load_verify_locations(cadata=tls.client_ca)
            except (ValueError, ssl.SSLError) as exc:
                raise WebConfigError(f"tls_server_config.client_ca: not PEM certificates: {exc}") from exc
        elif ctx.verify_mode != ssl.CERT_NONE:
            ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)  # Go's nil ClientCAs: the system roots
        if self._cert is None or self._key is None:  # excluded by _check_expressible
            raise WebConfigError("tls_server_config: cert_file and key_file are required")
        for field, path in (("cert_file", self._cert), ("key_file", self._key)):
            if not path.is_file():
                raise WebConfigError(f"tls_server_config.{field}: no such file {str(path)!r}")
        try:
            ctx.load_cert_chain(certfile=str(self._cert), keyfile=str(self._key))
        except (OSError, ssl.SSLError) as exc:
            raise WebConfigError(f"tls_server_config.cert_file/key_file: cannot load {str(self._cert)!r} "
                                 f"with {str(self._key)!r}: {exc}") from exc
        return ctx

    def maybe_reload(self) -> bool:
        """Rebuild ``current`` if a file changed; True when it did. Failures keep the old one."""
        stamp = self._stamps()
        if stamp == self._stamp:
            return False
        with self._lock:
            if stamp == self._stamp:
                return False
            try:
                fresh = self._build()
            except WebConfigError as exc:  # e.g. the key written, the certificate not yet
                log.warning("TLS files changed but do not load yet; serving the previous ones: %s",
                            exc.detail)
                return False
            self.current, self._stamp = fresh, stamp
            self.reloads += 1
            log.info("TLS certificate reloaded from %s", self._cert)
            return True

    def _on_failure(self, exc: ssl.SSLError) -> None:
        reason = handshake_reason(exc)
        self.handshake_failures.add(reason)
        log.warning("TLS handshake refused reason=%s: %s", reason, handshake_detail(exc))

    def _on_hello(self, conn: ssl.SSLObject | ssl.SSLSocket, name: str | None,
                  ctx: ssl.SSLContext) -> None:
        self.maybe_reload()
        if conn.context is not self.current:
            conn.context = self.current
