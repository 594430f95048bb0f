"""Thanos' own file formats, modelled on its Go structs and parsed strictly.

No Thanos binary can run here, so rendered files are checked against these models
instead: field names and types follow ``pkg/receive/config.go`` (``HashringConfig``,
``Endpoint``) and ``thanos-io/objstore`` (``BucketConfig``, S3/OSS/filesystem ``Config``).
Unknown keys are rejected, as the objstore loader's ``yaml.UnmarshalStrict`` does. Thanos
reads hashrings.json with plain ``json.Unmarshal``, which ignores a misspelt key; we
reject it anyway, since a silently ignored ``tenants`` would route every tenant to the
wrong ring. This is a stand-in for Thanos' parser, validated against documented formats.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from sharder.kernel.models import field_path


class ThanosFormatError(ValueError):
    """A file Thanos would refuse or misread; names the field and the value."""

    def __init__(self, message: str, *, field: str = "", value: Any = None, source: str = "") -> None:
        self.field, self.value, self.source, self.reason = field, value, source, message
        where = " ".join(
            p for p in (f"{source}:" if source else "", f"field '{field}'" if field else "") if p
        )
        shown = f" (value {value!r})" if value is not None and not isinstance(value, dict | list) else ""
        super().__init__(f"{where} {message}{shown}".strip())


class GoStruct(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Endpoint(GoStruct):
    address: str = Field(min_length=1)
    capnproto_address: str = ""
    az: str = ""


class ShuffleShardingConfig(GoStruct):
    shard_size: int = 0
    cache_size: int = 0
    zone_awareness_disabled: bool = False
    overrides: list[dict[str, Any]] = Field(default_factory=list)


class HashringConfig(GoStruct):
    hashring: str = ""
    tenants: list[str] = Field(default_factory=list)
    tenant_matcher_type: Literal["", "exact", "glob"] = ""
    endpoints: list[Endpoint | str]
    algorithm: Literal["", "hashmod", "ketama"] = ""
    external_labels: dict[str, str] = Field(default_factory=dict)
    shuffle_sharding_config: ShuffleShardingConfig = Field(default_factory=ShuffleShardingConfig)

    def endpoint_list(self) -> list[Endpoint]:
        return [Endpoint(address=e) if isinstance(e, str) else e for e in self.endpoints]


class SSEConfig(GoStruct):
    type: Literal["", "SSE-S3", "SSE-KMS", "SSE-C"] = ""
    kms_key_id: str = ""
    kms_encryption_context: dict[str, str] = Field(default_factory=dict)
    encryption_key: str = ""


class HTTPConfig(GoStruct):
    idle_conn_timeout: str = ""
    response_header_timeout: str = ""
    insecure_skip_verify: bool = False
    tls_handshake_timeout: str = ""
    expect_continue_timeout: str = ""
    max_idle_conns: int = 0
    max_idle_conns_per_host: int = 0
    max_conns_per_host: int = 0
    disable_compression: bool = False
    tls_config: dict[str, Any] = Field(default_factory=dict)


class S3Config(GoStruct):
    bucket: str
    endpoint: str
    region: str = ""
    disable_dualstack: bool = False
    aws_sdk_auth: bool = False
    access_key: str = ""
    insecure: bool = False
    signature_version2: bool = False
    secret_key: str = ""
    session_token: str = ""
    put_user_metadata: dict[str, str] = Field(default_factory=dict)
    http_config: HTTPConfig = Field(default_factory=HTTPConfig)
    trace: dict[str, bool] = Field(default_factory=dict)
    list_objects_version: Literal["", "v1", "v2"] = ""
    bucket_lookup_type: Literal["auto", "virtual-hosted", "path"] = "auto"
    send_content_md5: bool = True
    disable_multipart: bool = False
    part_size: int = 0
    sse_config: SSEConfig = Field(default_factory=SSEConfig)
    sts_endpoint: str = ""

    @field_validator("endpoint")
    @classmethod
    def _no_scheme(cls, value: str) -> str:
        # minio.New takes a host; with a scheme Thanos fails at startup.
        if not value or "://" in value:
            raise ValueError("S3 endpoint is host[:port] without a scheme")
        return value


class OSSConfig(GoStruct):
    endpoint: str
    bucket: str
    access_key_id: str
    access_key_secret: str

    @field_validator("endpoint")
    @classmethod
    def _https(cls, value: str) -> str:
        if not value.startswith("https://"):
            raise ValueError("gpufed requires an https:// Aliyun OSS endpoint")
        return value


class FilesystemConfig(GoStruct):
    directory: str


class BucketConfig(GoStruct):
    type: str
    config: dict[str, Any]
    prefix: str = ""


PROVIDERS: dict[str, type[GoStruct]] = {
    "S3": S3Config,
    "ALIYUNOSS": OSSConfig,
    "FILESYSTEM": FilesystemConfig,
}
_RINGS = TypeAdapter(list[HashringConfig])


def _raise(exc: ValidationError, *, source: str, prefix: str = "") -> None:
    errors = exc.errors()
    # A misspelt key also makes the real one "missing"; the misspelling is what to fix.
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = field_path(tuple(first["loc"]))
    field = f"{prefix}.{loc}" if prefix and loc else (prefix or loc)
    raise ThanosFormatError(
        str(first["msg"]).removeprefix("Value error, "), field=field, value=first.get("input"), source=source
    ) from exc


def parse_hashrings(text: str | bytes, *, source: str = "hashrings.json") -> list[HashringConfig]:
    """Parse a hashrings file; the catch-all ring (no tenants) must come last, as Thanos
    matches rings in order and a tenant-less ring takes every tenant."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ThanosFormatError(f"not JSON: {exc}", source=source) from exc
    if not isinstance(data, list) or not data:
        raise ThanosFormatError("expected a non-empty JSON array of hashrings", source=source)
    try:
        rings = _RINGS.validate_python(data)
    except ValidationError as exc:
        _raise(exc, source=source)
        raise
    for i, ring in enumerate(rings[:-1]):
        if not ring.tenants:
            raise ThanosFormatError(
                "a hashring without tenants shadows every ring after it",
                field=f"[{i}].tenants",
                source=source,
            )
    return rings


def parse_objstore(text: str | bytes, *, source: str = "objstore.yml") -> tuple[BucketConfig, GoStruct]:
    """Parse an objstore file into the bucket envelope and its provider's config."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ThanosFormatError(f"not YAML: {exc}", source=source) from exc
    if not isinstance(data, dict):
        raise ThanosFormatError("expected a mapping with type and config", source=source)
    try:
        bucket = BucketConfig.model_validate(data)
    except ValidationError as exc:
        _raise(exc, source=source)
        raise
    provider = PROVIDERS.get(bucket.type.upper())
    if provider is None:
        raise ThanosFormatError(
            f"unsupported object store type (known: {sorted(PROVIDERS)})",
            field="type",
            value=bucket.type,
            source=source,
        )
    try:
        return bucket, provider.model_validate(bucket.config)
    except ValidationError as exc:
        _raise(exc, source=source, prefix="config")
        raise
