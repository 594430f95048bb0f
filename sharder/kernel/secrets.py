"""What counts as a credential: one list for the spec's refusals, the API's masking, logs and the audit.

The spec refuses literal credentials wherever they can appear (URL userinfo, auth-like
headers, key-like query parameters, robot secrets): a secret is a reference (``${NAME}``
where the reader expands it, a file Prometheus or Alertmanager reads, or
``{env: NAME}``/``{file: PATH}`` in ``thanos.objstore``). ``federation.controller.http.redact``
masks by the same names as defence in depth. Errors name the field and the value's
*shape* (``a 32-character literal``), never the value.
"""

from __future__ import annotations

import functools
import re
from urllib.parse import unquote, urlsplit

SECRET_WORDS = frozenset(
    {
        "password", "passwd", "pass", "pwd", "passphrase", "secret", "secrets", "token", "tokens",
        "credential", "credentials", "auth", "authorization", "signature", "sig", "sign", "key",
        "session", "cookie", "jwt", "bearer", "otp", "apikey", "accesskey", "secretkey",
        "privatekey", "authkey", "passkey", "passcode", "hmac",
    }
)  # fmt: skip
"""A name whose *last* word is one of these carries a credential: ``X-Api-Key``,
``accessToken``, ``MyApiKey``, ``?pass=``, ``?jwt=``, ``routing_key``. A name whose last
word is ``file``, ``path``, ``id``, ``url``, ``type``... does not (``password_file`` names
where the secret is; ``token_url`` is an endpoint; ``access_key_id`` is an account name)."""
SECRET_ENDINGS = (
    "password", "passwd", "secret", "token", "apikey", "accesskey", "secretkey", "privatekey",
    "passphrase", "credentials", "authorization", "passcode", "credential",
)  # fmt: skip
"""Endings of one run-together lower-case word (``accesstoken``, ``xapikey``, ``clientsecret``)."""
SECRET_HEADERS = frozenset(
    {
        "x-honeycomb-team", "x-pass", "x-api-pass", "proxy-authorization", "x-registry-auth",
        "slack_api_url", "webhook_url", "mattermost_webhook_url", "token_id", "rocketchat_token_id",
    }
)  # fmt: skip
"""Whole names that carry a credential although their last word says nothing (Honeycomb's
team key; Alertmanager's ``<secret>`` URLs, whose path is the credential)."""
WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
SECRET_NAMES = tuple(sorted(SECRET_WORDS))
"""Kept for callers of the first list (one list: these words, endings and headers)."""
REFERENCE = re.compile(r"^(\$\{[A-Za-z_][A-Za-z0-9_]*(:?[-?][^}]*)?\}|\$\([A-Za-z_][A-Za-z0-9_]*\))$")
"""``${NAME}`` (expanded by the relay, the shell or Helm) or ``$(NAME)`` (Kubernetes)."""


MASK = "<redacted>"
"""What a masked value is served as (the API, logs, HTTP SD labels)."""
LITERAL = "a literal credential"
"""Messages that start with this name no value: the spec loader leaves the input out."""


def is_secret_name(name: str) -> bool:
    """``X-Api-Key``, ``accessToken``, ``MyApiKey``, ``password``, ``X-Honeycomb-Team``... (a
    header, query parameter or key name), case-insensitive and camelCase-aware."""
    if len(name) > 256:  # no credential is named by a paragraph; bounds the work per name
        name = name[-256:]
    lowered = name.strip().lower()
    if lowered in SECRET_HEADERS or lowered.replace("_", "-") in SECRET_HEADERS:
        return True
    words = [w.lower() for w in WORD.findall(name)]
    while words and words[-1].isdigit():  # X-Api-Key-2, token2: a numbered credential is one
        words.pop()
    if not words:
        return False
    last = words[-1]
    if last.endswith("s") and len(last) > 3 and last[:-1] in SECRET_WORDS:  # apiKeys, passwords
        last = last[:-1]
    return last in SECRET_WORDS or last.rstrip("s").endswith(SECRET_ENDINGS)


def is_reference(value: str) -> bool:
    return bool(REFERENCE.match(value))


def shape(value: str) -> str:
    """What a refused value looks like, without showing it."""
    return f"a {len(value)}-character literal"


def _pairs(component: str) -> list[tuple[str, str]]:
    """``name=value`` pairs of a query, fragment or path parameters, split on ``&`` and ``;``."""
    out = []
    for pair in re.split(r"[&;]", component):
        name, sep, value = pair.partition("=")
        if sep:
            out.append((unquote(name), unquote(value)))
    return out


QUERY_NAMES = frozenset({"code", "access_code", "sv", "se"})
"""Query parameters that carry a credential although a label of that name would not: Azure
Functions' and OAuth's ``?code=``; a SAS URL's signed fields sit beside its ``sig``."""


def _secret_pair(name: str, value: str) -> bool:
    secret = is_secret_name(name) or name.strip().lower() in QUERY_NAMES
    return secret and bool(value) and not is_reference(value)


WEBHOOK_PATHS = (
    # (host suffix, path prefix): services whose webhook URL's *path* is the credential
    ("open.feishu.cn", "/open-apis/bot/"),
    ("open.larksuite.com", "/open-apis/bot/"),
    ("feishu.cn", "/flow/api/trigger-webhook/"),
    ("larksuite.com", "/flow/api/trigger-webhook/"),
    ("hooks.slack.com", "/"),
    ("discord.com", "/api/"),
    ("discordapp.com", "/api/"),
    ("api.telegram.org", "/bot"),
    ("webhook.office.com", "/"),
    ("outlook.office.com", "/webhook"),
    ("outlook.office365.com", "/webhook"),
    ("logic.azure.com", "/workflows/"),
    ("api.powerplatform.com", "/powerautomate/"),
    ("oapi.dingtalk.com", "/robot/"),
    ("qyapi.weixin.qq.com", "/cgi-bin/webhook/"),
)
"""From each service's documented URL format: Feishu/Lark ``/open-apis/bot/v2/hook/<token>``,
Slack ``hooks.slack.com/services/T…/B…/<secret>``, Discord ``/api/webhooks/<id>/<token>``,
Telegram ``/bot<token>/<method>``, Teams ``<org>.webhook.office.com/webhookb2/…`` (and
Workflows' ``logic.azure.com`` trigger URLs), DingTalk ``/robot/send?access_token=`` and WeCom
``/cgi-bin/webhook/send?key=``. Served whole they are masked whole."""
HOOK_SEGMENTS = frozenset({"hook", "hooks", "webhook", "webhooks", "webhookb2", "trigger-webhook"})


def webhook_credential(url: str) -> bool:
    """``url`` is a webhook whose path is (or holds) the credential: a known service's, or any
    URL with a ``/hook(s)/`` or ``/webhook(s)/`` segment followed by more path."""
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
    except ValueError:
        return False
    if not host or parts.scheme.lower() not in ("http", "https"):
        return False
    for suffix, prefix in WEBHOOK_PATHS:
        if (host == suffix or host.endswith("." + suffix)) and parts.path.startswith(prefix):
            return True
    segments = [s for s in parts.path.lower().split("/") if s]
    return any(s in HOOK_SEGMENTS and i + 1 < len(segments) for i, s in enumerate(segments))


USERINFO = re.compile(r"(?<![\w.+-])[^\s/@:'\"<>]{1,256}:[^\s/@'\"<>]{1,256}@(?=[\w\[])")
"""``user:password@host`` without a scheme (an address given where a host was expected)."""


def mask_userinfo(text: str, mask: str) -> str:
    return USERINFO.sub(f"{mask}@", text) if "@" in text else text


def url_secret(url: str) -> str | None:
    """Why ``url`` holds a literal credential (userinfo, a key-like query parameter, path
    parameter or fragment parameter), or None."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    if parts.password is not None:
        return f"a password in the URL's userinfo ({shape(parts.password)})"
    if parts.username is not None and parts.username and "@" in parts.netloc:
        return f"a user name in the URL's userinfo ({shape(parts.username)})"
    params = parts.path.partition(";")[2]
    for where, component in (("query", parts.query), ("path", params), ("fragment", parts.fragment)):
        for name, value in _pairs(component):
            if _secret_pair(name, value):
                return f"{where} parameter {name!r} holds {shape(value)}"
    return None


def _mask_pairs(component: str, mask: str) -> str:
    pieces = re.split(r"([&;])", component)  # linear: the separators are kept as pieces
    for i, piece in enumerate(pieces):
        name, sep, value = piece.partition("=")
        if sep and _secret_pair(unquote(name), unquote(value)):
            pieces[i] = f"{name}={mask}"
    return "".join(pieces)


QUERY_CREDENTIAL_WEBHOOKS = (
    ("oapi.dingtalk.com", "/robot/", "access_token"),
    ("qyapi.weixin.qq.com", "/cgi-bin/webhook/", "key"),
)
"""Robot webhooks whose credential is one query parameter (DingTalk ``access_token``, WeCom
``key``): with that parameter a reference (``${DINGTALK_SRE_TOKEN}``, which the relay fills from
its environment) the URL holds no secret and is served as it is, so a relay that syncs its file
from the controller (the chart) can use it."""


def _reference_only_robot(url: str) -> bool:
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    host = (parts.hostname or "").lower()
    for robot_host, prefix, credential in QUERY_CREDENTIAL_WEBHOOKS:
        if host == robot_host and parts.path.startswith(prefix):
            pairs = _pairs(parts.query)
            given = [v for n, v in pairs if n == credential]
            return (bool(given) and all(is_reference(v) for v in given)
                    and not any(_secret_pair(n, v) for n, v in pairs)
                    and "@" not in parts.netloc and not parts.fragment)
    return False


def mask_url(url: str, mask: str) -> str:
    """``url`` with userinfo and key-like query, path-parameter and fragment values replaced by
    ``mask`` (references kept); a webhook whose path is the credential masked whole."""
    if webhook_credential(url) and not _reference_only_robot(url):
        return mask
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{mask}@{netloc.rpartition('@')[2]}"
    path, sep, params = parts.path.partition(";")
    return parts._replace(
        netloc=netloc,
        path=path + sep + _mask_pairs(params, mask) if sep else path,
        query=_mask_pairs(parts.query, mask),
        fragment=_mask_pairs(parts.fragment, mask),
    ).geturl()


def shown(value: object, *, field: str = "") -> object:
    """What an error may show of ``value`` found at ``field``: the shape of a string under a
    secret name or holding a credential URL, the value otherwise."""
    if isinstance(value, dict):
        return {k: shown(v, field=str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [shown(v, field=field) for v in value]
    if not isinstance(value, str):
        return value
    last = re.split(r"[.\[\] ]+", field.replace(" (key)", "").strip(".[] "))[-1] if field else ""
    if last and is_secret_name(last):
        return Shape(shape(value))
    if ("://" in value or "=" in value) and (url_secret(value) is not None or webhook_credential(value)):
        return Shape(shape(value))
    if "@" in value and USERINFO.search(value):
        return Shape(shape(value))
    return value


def mask_labels(labels: dict[str, str], mask: str) -> dict[str, str]:
    """Target labels as served: a value under a secret name (not a reference) masked whole, a
    URL's credentials masked; ``labels`` itself when nothing needed masking (the common case,
    one name check and two ``in`` tests per label)."""
    out: dict[str, str] | None = None
    for name, value in labels.items():
        masked = value
        if _secret_label(name) and value and not is_reference(value):
            masked = mask
        elif "://" in value:
            masked = mask_url(value, mask)
        elif "@" in value:
            masked = mask_userinfo(value, mask)
        if masked is not value and masked != value:
            if out is None:
                out = dict(labels)
            out[name] = masked
    return labels if out is None else out


@functools.lru_cache(maxsize=4096)
def _secret_label(name: str) -> bool:
    return is_secret_name(name) and not name.endswith("_file")


class Shape(str):
    """A value's description in place of the value (``a 12-character literal``)."""
