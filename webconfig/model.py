"""The web configuration file of prometheus/exporter-toolkit, as a strict model.

``gpufed serve``, ``gpufed-exporter serve`` and ``gpufed-dingtalk`` read the same file
(``--web.config.file``) as node-exporter, Prometheus and Alertmanager: ``tls_server_config``,
``http_server_config``, ``basic_auth_users`` (bcrypt hashes) and ``rate_limit``. The format is
exporter-toolkit's docs/web-configuration.md; its example files are vendored under
tests/webconfig/upstream/ and must parse here. Unknown keys are refused with the field named.

What Go accepts and Python's ``ssl`` cannot do is still *parsed* (the file is valid), and
refused by ``webconfig.tls.build_context`` with the field named: see that module's docstring.

Pipeline: ``load(path)`` -> ``WebConfig`` -> ``webconfig.tls`` (SSLContext, reloaded on
change) and ``webconfig.guard`` (basic auth, headers, rate limit) at each server's edge.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

CLIENT_AUTH_TYPES = (
    "NoClientCert",
    "RequestClientCert",
    "RequireAnyClientCert",
    "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert",
)
TLS_VERSIONS = ("TLS10", "TLS11", "TLS12", "TLS13")

# Go's crypto/tls names (tls.CipherSuites()) -> OpenSSL names; None: a TLS 1.3 suite, which
# neither Go nor Python's ssl lets a server restrict (both always offer their TLS 1.3 set).
CIPHER_SUITES: dict[str, str | None] = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_AES_128_GCM_SHA256": None,
    "TLS_AES_256_GCM_SHA384": None,
    "TLS_CHACHA20_POLY1305_SHA256": None,
}
# Go's tls.CurveID names -> OpenSSL group names (ssl.SSLContext.set_ecdh_curve).
CURVES: dict[str, str] = {
    "CurveP256": "prime256v1",
    "CurveP384": "secp384r1",
    "CurveP521": "secp521r1",
    "X25519": "X25519",
}
BCRYPT = re.compile(r"^\$2[abxy]?\$\d{2}\$[./A-Za-z0-9]{53}$")
HEADERS = (
    "Content-Security-Policy",
    "X-Frame-Options",
    "X-Content-Type-Options",
    "X-XSS-Protection",
    "Strict-Transport-Security",
)
DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+)s)?(?:(\d+)ms)?$")


class WebConfigError(ValueError):
    """The file is unreadable, not YAML, or fails the model: ``detail`` names file, field and value."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


NonEmpty = Annotated[str, Field(min_length=1)]


class TLSServerConfig(_Strict):
    cert: NonEmpty | None = None
    key: NonEmpty | None = None
    client_ca: NonEmpty | None = None
    cert_file: NonEmpty | None = None
    key_file: NonEmpty | None = None
    client_auth_type: Literal[CLIENT_AUTH_TYPES] = "NoClientCert"  # type: ignore[valid-type]
    client_ca_file: NonEmpty | None = None
    client_allowed_sans: list[str] | None = None
    min_version: Literal[TLS_VERSIONS] = "TLS12"  # type: ignore[valid-type]
    max_version: Literal[TLS_VERSIONS] = "TLS13"  # type: ignore[valid-type]
    cipher_suites: list[str] | None = None
    prefer_server_cipher_suites: bool = True
    curve_preferences: list[str] | None = None

    @field_validator("cipher_suites")
    @classmethod
    def _known_ciphers(cls, value: list[str] | None) -> list[str] | None:
        for name in value or []:
            if name not in CIPHER_SUITES:
                raise ValueError(f"unknown cipher suite {name!r} (Go crypto/tls names, e.g. "
                                 "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256)")
        return value

    @field_validator("curve_preferences")
    @classmethod
    def _known_curves(cls, value: list[str] | None) -> list[str] | None:
        for name in value or []:
            if name not in CURVES:
                raise ValueError(f"unknown curve {name!r}; known: {', '.join(CURVES)}")
        return value

    @model_validator(mode="after")
    def _coherent(self) -> TLSServerConfig:
        if self.cert is not None and self.cert_file is not None:
            raise ValueError("cert and cert_file are exclusive: give one")
        if self.key is not None and self.key_file is not None:
            raise ValueError("key and key_file are exclusive: give one")
        if self.client_ca is not None and self.client_ca_file is not None:
            raise ValueError("client_ca and client_ca_file are exclusive: give one")
        if self.cert is None and self.cert_file is None:
            raise ValueError("cert_file (or cert) is required when tls_server_config is set")
        if self.key is None and self.key_file is None:
            raise ValueError("key_file (or key) is required when tls_server_config is set")
        if TLS_VERSIONS.index(self.min_version) > TLS_VERSIONS.index(self.max_version):
            raise ValueError(f"min_version {self.min_version} is above max_version {self.max_version}")
        # As exporter-toolkit: a client CA with no policy is a mistake (nothing would be checked);
        # a verifying policy with no CA verifies against the system's roots.
        if self.client_auth_type == "NoClientCert" and (self.client_ca or self.client_ca_file):
            raise ValueError("client CAs are configured but client_auth_type is NoClientCert; "
                             "set client_auth_type: RequireAndVerifyClientCert")
        return self


class Headers(_Strict):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, populate_by_name=False)

    content_security_policy: str | None = Field(default=None, alias="Content-Security-Policy")
    x_frame_options: str | None = Field(default=None, alias="X-Frame-Options")
    x_content_type_options: str | None = Field(default=None, alias="X-Content-Type-Options")
    x_xss_protection: str | None = Field(default=None, alias="X-XSS-Protection")
    strict_transport_security: str | None = Field(default=None, alias="Strict-Transport-Security")

    @field_validator("x_xss_protection", mode="before")
    @classmethod
    def _int_ok(cls, value: object) -> object:
        # `X-XSS-Protection: 1` is an int to YAML; upstream's example writes it that way.
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("x_frame_options")
    @classmethod
    def _frame(cls, value: str | None) -> str | None:
        if value and value.lower() not in ("deny", "sameorigin"):
            raise ValueError(f"X-Frame-Options must be deny or sameorigin, got {value!r}")
        return value

    @field_validator("x_content_type_options")
    @classmethod
    def _nosniff(cls, value: str | None) -> str | None:
        if value and value.lower() != "nosniff":
            raise ValueError(f"X-Content-Type-Options must be nosniff, got {value!r}")
        return value

    def items(self) -> list[tuple[str, str]]:
        """The headers to add to every response, blank ones left out, in the file's fixed order."""
        values = (self.content_security_policy, self.x_frame_options, self.x_content_type_options,
                  self.x_xss_protection, self.strict_transport_security)
        return [(name, value) for name, value in zip(HEADERS, values, strict=True) if value]


class HTTPServerConfig(_Strict):
    # Accepted for compatibility; our servers speak HTTP/1.1 only, as with http2: false.
    http2: bool = True
    headers: Headers | None = None


class RateLimit(_Strict):
    interval: str = "0s"
    burst: int = Field(default=0, ge=0)

    @field_validator("interval")
    @classmethod
    def _duration(cls, value: str) -> str:
        if value != "0" and (not value or not DURATION.match(value)):
            raise ValueError(f"interval must be a duration such as 1s, 500ms or 1m, got {value!r}")
        return value

    def seconds(self) -> float:
        match = DURATION.match(self.interval)
        if self.interval == "0" or match is None:
            return 0.0
        h, m, s, ms = (int(g) if g else 0 for g in match.groups())
        return h * 3600 + m * 60 + s + ms / 1000


class WebConfig(_Strict):
    tls_server_config: TLSServerConfig | None = None
    http_server_config: HTTPServerConfig | None = None
    basic_auth_users: dict[str, str] | None = None
    rate_limit: RateLimit | None = None

    @field_validator("basic_auth_users")
    @classmethod
    def _bcrypt(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for user, hashed in (value or {}).items():
            if not BCRYPT.match(hashed):
                raise ValueError(f"user {user!r}: the password must be a bcrypt hash ($2y$10$...), "
                                 "e.g. from `htpasswd -nBC 10 \"\" | tr -d ':\\n'`")
        return value


def _where(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(top level)"


def load_mapping(text: str, *, source: str, expected: str) -> dict[str, Any]:
    """YAML text -> its top-level mapping (an empty file is an empty one); anything else is one
    WebConfigError naming ``source`` and what was ``expected``."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise WebConfigError(f"{source}: not YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise WebConfigError(
            f"{source}: expected a mapping {expected}; got {type(data).__name__} {data!r:.60}")
    return data


def parse(text: str, *, source: str = "<web config>") -> WebConfig:
    """YAML text -> ``WebConfig``; an empty file is the empty config (plain HTTP, no auth)."""
    data = load_mapping(text, source=source,
                        expected="of tls_server_config, http_server_config, basic_auth_users, rate_limit")
    try:
        return WebConfig.model_validate(data)
    except ValidationError as exc:
        raise describe(exc, source=source) from exc


def describe(exc: ValidationError, *, source: str) -> WebConfigError:
    """The first problem of ``exc`` as ``file: field: message (value)``; secrets never shown."""
    first = exc.errors()[0]
    field = _where(first["loc"])
    if first["type"] == "extra_forbidden":
        message = "unknown field"
    else:
        message = first["msg"].removeprefix("Value error, ")
    value = first["input"]
    secret = field.startswith("basic_auth_users") or field.endswith(".key")
    shown = "" if secret or isinstance(value, dict | list) else f" (value {value!r:.80})"
    return WebConfigError(f"{source}: {field}: {message}{shown}")


def load(path: Path) -> WebConfig:
    """Read and validate ``--web.config.file``; relative file names in it are resolved by
    ``webconfig.tls`` against the file's folder, as exporter-toolkit does."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WebConfigError(f"{path}: cannot read the web config: {exc}") from exc
    return parse(text, source=str(path))
