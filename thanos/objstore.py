"""The ``thanos.objstore`` section: S3, Aliyun OSS or a local directory, with secrets as references.

Mirrors what Thanos' object-store clients accept (``thanos.formats`` models the files
themselves) and refuses what they would reject at startup or silently misuse: an S3
endpoint with a scheme, an OSS endpoint without https, one S3 key without the other.
Secrets are never literal strings: ``{env: NAME}`` or ``{file: PATH}``.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from sharder.kernel.models import StrictModel

ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

class SecretRef(StrictModel):
    """Where a secret comes from at runtime; the rendered files only name the variable."""

    env: str | None = None
    file: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> SecretRef:
        if (self.env is None) == (self.file is None):
            raise ValueError("a secret is {env: NAME} or {file: PATH}, exactly one of them")
        if self.env is not None and not ENV_NAME_RE.match(self.env):
            raise ValueError(f"not an environment variable name: {self.env!r}")
        if self.file is not None and not self.file.startswith("/"):
            raise ValueError(f"secret files are absolute paths, got {self.file!r}")
        return self


class SSESpec(StrictModel):
    type: Literal["SSE-S3", "SSE-KMS", "SSE-C"]
    kms_key_id: str | None = None
    encryption_key_file: str | None = Field(default=None, description="SSE-C key; Thanos reads the file")

    @model_validator(mode="after")
    def _required(self) -> SSESpec:
        if self.type == "SSE-KMS" and not self.kms_key_id:
            raise ValueError("SSE-KMS needs kms_key_id")
        if self.type == "SSE-C" and not self.encryption_key_file:
            raise ValueError("SSE-C needs encryption_key_file (a path Thanos reads the key from)")
        return self


class S3Spec(StrictModel):
    bucket: str = Field(min_length=1)
    endpoint: str = Field(description="host[:port], no scheme; use insecure for plain HTTP")
    region: str | None = None
    insecure: bool = False
    access_key: SecretRef | None = None
    secret_key: SecretRef | None = None
    sse: SSESpec | None = None

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        if "://" in value:
            raise ValueError("S3 endpoint is host[:port] without http(s)://; set insecure: true for HTTP")
        if not value or "/" in value:
            raise ValueError(f"S3 endpoint must be a host name, got {value!r}")
        return value

    @model_validator(mode="after")
    def _keys_together(self) -> S3Spec:
        if (self.access_key is None) != (self.secret_key is None):
            raise ValueError(
                "set access_key and secret_key together, or neither (then Thanos uses "
                "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, the credentials file or IAM)"
            )
        return self


class OSSSpec(StrictModel):
    bucket: str = Field(min_length=1)
    endpoint: str
    access_key_id: SecretRef
    access_key_secret: SecretRef

    @field_validator("endpoint")
    @classmethod
    def _https(cls, value: str) -> str:
        if not value.startswith("https://") or len(value) <= len("https://"):
            raise ValueError(
                "Aliyun OSS endpoint must be an https:// URL (e.g. https://oss-cn-beijing.aliyuncs.com)"
            )
        return value


class FilesystemSpec(StrictModel):
    directory: str

    @field_validator("directory")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"filesystem bucket directory must be absolute, got {value!r}")
        return value


class S3Store(StrictModel):
    type: Literal["S3"]
    config: S3Spec
    prefix: str = ""


class OSSStore(StrictModel):
    type: Literal["ALIYUNOSS"]
    config: OSSSpec
    prefix: str = ""


class FilesystemStore(StrictModel):
    type: Literal["FILESYSTEM"]
    config: FilesystemSpec
    prefix: str = ""


ObjstoreSpec = Annotated[S3Store | OSSStore | FilesystemStore, Field(discriminator="type")]
