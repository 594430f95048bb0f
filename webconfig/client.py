"""Prometheus' HTTP client file (``http_config``) for gpufed's own outgoing calls over TLS.

The file ``promtool check ready --http.config.file`` and ``amtool --http.config.file`` read,
and the one ``gpufed render`` writes beside the web config (``tls/http-client.yml``)::

    tls_config:
      ca_file: /etc/gpufed/tls/ca.crt      # the CA the server's certificate is checked against
      cert_file: /etc/gpufed/tls/client.crt  # the client certificate, where servers require one
      key_file: /etc/gpufed/tls/client.key
      server_name: gpufed-controller       # optional: the name checked in the server certificate

Who reads it: ``gpufed serve --http.config.file`` (its calls to the children, ``--child-url``
and ``--child-url-template``, and to ``--load-url``) and ``gpufed-exporter
--register-http-config-file`` (its registry calls to the controller). Relative file names are
resolved against the file's folder, as Prometheus does.

Of prometheus/common's ``HTTPClientConfig`` only ``tls_config`` (and the harmless
``follow_redirects``, ``enable_http2``) is taken: the callers authenticate with bearer tokens
of their own, so ``basic_auth``, ``authorization``, ``oauth2`` and proxies are refused with the
field named, as are inline ``cert``/``key`` (Python's ``ssl`` loads them from files).

Rotation: :class:`ReloadingClientContext` is the ``SSLContext`` handed to the HTTP client; each
new connection stats the files and, when one changed, is made from a context built afresh, so
a renewed client certificate is presented without a restart (a renewal that does not load yet
keeps the previous one). ``server_name`` is the name every connection sends and checks.
"""

from __future__ import annotations

import logging
import ssl
import threading
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError, model_validator

from webconfig.model import TLS_VERSIONS, NonEmpty, WebConfigError, _Strict, describe, load_mapping
from webconfig.tls import _VERSIONS, Stamp, file_stamps

log = logging.getLogger(__name__)

#: prometheus/common HTTPClientConfig keys gpufed's clients do not implement: refused by name.
UNSUPPORTED = ("basic_auth", "authorization", "oauth2", "bearer_token", "bearer_token_file",
               "proxy_url", "no_proxy", "proxy_from_environment", "proxy_connect_header", "http_headers")


class TLSClientConfig(_Strict):
    ca: NonEmpty | None = None
    ca_file: NonEmpty | None = None
    cert: NonEmpty | None = None
    cert_file: NonEmpty | None = None
    key: NonEmpty | None = None
    key_file: NonEmpty | None = None
    server_name: NonEmpty | None = None
    insecure_skip_verify: bool = False
    min_version: Literal[TLS_VERSIONS] | None = None  # type: ignore[valid-type]
    max_version: Literal[TLS_VERSIONS] | None = None  # type: ignore[valid-type]

    @model_validator(mode="after")
    def _coherent(self) -> TLSClientConfig:
        if self.cert is not None or self.key is not None:
            raise ValueError("inline cert and key are not supported (Python's ssl loads them from "
                             "files): use cert_file and key_file")
        if self.ca is not None and self.ca_file is not None:
            raise ValueError("ca and ca_file are exclusive: give one")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together: a client certificate needs its key")
        return self


class HTTPClientConfig(_Strict):
    tls_config: TLSClientConfig | None = None
    follow_redirects: bool = True
    enable_http2: bool = True  # accepted; gpufed's clients speak HTTP/1.1


def parse(text: str, *, source: str = "<http config>") -> HTTPClientConfig:
    data = load_mapping(text, source=source, expected="with tls_config")
    for key in UNSUPPORTED:
        if key in data:
            raise WebConfigError(f"{source}: {key}: not supported by gpufed's clients (they send bearer "
                                 "tokens of their own; authenticate with tls_config's client certificate)")
    try:
        return HTTPClientConfig.model_validate(data)
    except ValidationError as exc:
        raise describe(exc, source=source) from exc


def load(path: Path) -> HTTPClientConfig:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WebConfigError(f"{path}: cannot read the HTTP client config: {exc}") from exc
    return parse(text, source=str(path))


def _resolve(name: str | None, base: Path) -> Path | None:
    if name is None:
        return None
    path = Path(name)
    return path if path.is_absolute() else base / path




class ReloadingClientContext(ssl.SSLContext):
    """A client ``SSLContext`` whose connections come from a context rebuilt when the files change."""

    def __new__(cls, tls: TLSClientConfig, *, base: Path) -> ReloadingClientContext:
        return super().__new__(cls, ssl.PROTOCOL_TLS_CLIENT)

    def __init__(self, tls: TLSClientConfig, *, base: Path) -> None:
        self._tls = tls
        self._files = tuple(_resolve(n, base) for n in (tls.ca_file, tls.cert_file, tls.key_file))
        self.server_name = tls.server_name
        self._lock = threading.Lock()
        self._stamp = self._stamps()
        self.reloads = 0
        self.current = self._build()  # errors here are the startup's: raised, field named

    def _stamps(self) -> Stamp:
        return file_stamps(self._files)

    def _build(self) -> ssl.SSLContext:
        tls = self._tls
        ca, cert, key = self._files
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        if tls.min_version is not None:
            ctx.minimum_version = _VERSIONS[tls.min_version]
        if tls.max_version is not None:
            ctx.maximum_version = _VERSIONS[tls.max_version]
        try:
            if ca is not None:
                ctx.load_verify_locations(cafile=str(ca))
            elif tls.ca is not None:
                ctx.load_verify_locations(cadata=tls.ca)
        except (OSError, ValueError, ssl.SSLError) as exc:
            raise WebConfigError(f"tls_config.{'ca_file' if ca else 'ca'}: cannot load "
                                 f"{str(ca) if ca else 'the inline CA'!r}: {exc}") from exc
        if cert is not None and key is not None:
            try:
                ctx.load_cert_chain(certfile=str(cert), keyfile=str(key))
            except (OSError, ssl.SSLError) as exc:
                raise WebConfigError(f"tls_config.cert_file/key_file: cannot load {str(cert)!r} with "
                                     f"{str(key)!r}: {exc}") from exc
        if tls.insecure_skip_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def fresh(self) -> ssl.SSLContext:
        """The context for a new connection, rebuilt first if a file changed."""
        stamp = self._stamps()
        if stamp != self._stamp:
            with self._lock:
                if stamp != self._stamp:
                    try:
                        self.current = self._build()
                        self.reloads += 1
                        log.info("TLS client certificate reloaded from %s", self._files[1] or self._files[0])
                    except WebConfigError as exc:
                        log.warning("TLS client files changed but do not load yet; keeping the previous "
                                    "ones: %s", exc.detail)
                    self._stamp = stamp
        return self.current

    def wrap_socket(self, sock: Any, server_side: bool = False, do_handshake_on_connect: bool = True,
                    suppress_ragged_eofs: bool = True, server_hostname: Any = None,
                    session: Any = None) -> ssl.SSLSocket:
        return self.fresh().wrap_socket(
            sock, server_side=server_side, do_handshake_on_connect=do_handshake_on_connect,
            suppress_ragged_eofs=suppress_ragged_eofs,
            server_hostname=self.server_name or server_hostname, session=session)

    def wrap_bio(self, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO, server_side: bool = False,
                 server_hostname: Any = None, session: Any = None) -> ssl.SSLObject:
        return self.fresh().wrap_bio(incoming, outgoing, server_side=server_side,
                                     server_hostname=self.server_name or server_hostname, session=session)


def client_context(path: Path | None) -> ReloadingClientContext | None:
    """The ``SSLContext`` of ``path``'s ``tls_config``; None without a file or a ``tls_config``
    (the client then verifies against the system's roots, as before)."""
    if path is None:
        return None
    config = load(path)
    if config.tls_config is None:
        return None
    return ReloadingClientContext(config.tls_config, base=path.resolve().parent)
