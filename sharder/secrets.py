"""What counts as a credential: one list for the spec's refusals, the API's masking, logs and the audit.

The spec refuses literal credentials wherever they can appear (URL userinfo, auth-like
headers, key-like query parameters, robot secrets): a secret is a reference (``${NAME}``
where the reader expands it, a file Prometheus or Alertmanager reads, or
``{env: NAME}``/``{file: PATH}`` in ``thanos.objstore``). ``federation.controller.http.redact``
masks by the same names as defence in depth. Errors name the field and the value's
*shape* (``a 32-character literal``), never the value.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlsplit

SECRET_NAMES = (
    "password",
    "passwd",
    "pwd",
    "secret",
    "token",
    "credentials",
    "credential",
    "access_key",
    "accesskey",
    "secret_key",
    "private_key",
    "api_key",
    "apikey",
    "api-key",
    "auth",
    "authorization",
    "signature",
    "sig",
    "sign",
    "key",
    "session",
    "cookie",
)
"""Name endings (case-insensitive, any of ``-``/``_`` before them) that carry a credential."""
SECRET_NAME = re.compile(
    r"(^|[-_.])(" + "|".join(re.escape(n) for n in SECRET_NAMES) + r")$|^x-.*(token|key|auth)$",
    re.IGNORECASE,
)
REFERENCE = re.compile(r"^(\$\{[A-Za-z_][A-Za-z0-9_]*(:?[-?][^}]*)?\}|\$\([A-Za-z_][A-Za-z0-9_]*\))$")
"""``${NAME}`` (expanded by the relay, the shell or Helm) or ``$(NAME)`` (Kubernetes)."""


LITERAL = "a literal credential"
"""Messages that start with this name no value: the spec loader leaves the input out."""


def is_secret_name(name: str) -> bool:
    """``X-Api-Key``, ``access_token``, ``password``... (a header, query parameter or key name)."""
    return bool(SECRET_NAME.search(name.replace(" ", "")))


def is_reference(value: str) -> bool:
    return bool(REFERENCE.match(value))


def shape(value: str) -> str:
    """What a refused value looks like, without showing it."""
    return f"a {len(value)}-character literal"


def url_secret(url: str) -> str | None:
    """Why ``url`` holds a literal credential (userinfo, a key-like query parameter), or None."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    if parts.password is not None:
        return f"a password in the URL's userinfo ({shape(parts.password)})"
    if parts.username is not None and parts.username and "@" in parts.netloc:
        return f"a user name in the URL's userinfo ({shape(parts.username)})"
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if is_secret_name(name) and value and not is_reference(value):
            return f"query parameter {name!r} holds {shape(value)}"
    return None


def mask_url(url: str, mask: str) -> str:
    """``url`` with userinfo and key-like query values replaced by ``mask`` (references kept)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{mask}@{netloc.rpartition('@')[2]}"
    query = "&".join(
        f"{name}={mask}" if is_secret_name(name) and value and not is_reference(value) else pair
        for pair in parts.query.split("&")
        if pair
        for name, _, value in [pair.partition("=")]
    )
    return parts._replace(netloc=netloc, query=query).geturl()
