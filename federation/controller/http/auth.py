"""Bearer tokens with names and scopes, compared in constant time.

Tokens come from a tokens file (YAML: ``tokens: [{name, token, scopes}]``) and, for
simple setups, from ``GPUFED_TOKEN`` (name ``env``, scopes read/write/register) and
``GPUFED_READ_TOKEN`` (name ``env-read``, scope read: what the chart's readers carry). A
token shorter than 16 characters, made of one repeated character, or a known
placeholder is refused at start: the service will not run with a guessable token
unless ``--dev`` is given (and then says so on every start).
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

SCOPES = frozenset({"read", "write", "register"})
PLACEHOLDERS = frozenset(
    {
        "changeme",
        "change-me",
        "change_me",
        "secret",
        "token",
        "password",
        "example",
        "placeholder",
        "replace-me",
        "replaceme",
        "todo",
        "xxx",
        "default",
        "admin",
        "test",
    }
)
MIN_LENGTH = 16


class TokenError(ValueError):
    pass


@dataclass(frozen=True)
class Token:
    name: str
    secret: str
    scopes: frozenset[str]


@dataclass(frozen=True)
class Caller:
    name: str
    scopes: frozenset[str]


DEV_CALLER = Caller(name="dev", scopes=SCOPES)


def check_secret(secret: str, *, where: str) -> None:
    lowered = secret.lower()
    if len(secret) < MIN_LENGTH:
        raise TokenError(f"{where}: a token needs at least {MIN_LENGTH} characters")
    letters = re.sub(r"[^a-z]", "", lowered)
    repeated = any(letters and letters == p * (len(letters) // len(p)) for p in PLACEHOLDERS)
    if len(set(secret)) == 1 or repeated or lowered.startswith(("<", "${")):
        raise TokenError(f"{where}: the token looks like a placeholder; generate one (openssl rand -hex 24)")


def load_tokens(path: Path | None, *, env: Mapping[str, str]) -> list[Token]:
    tokens: list[Token] = []
    if path is not None:
        try:
            doc: Any = yaml.load(path.read_text(encoding="utf-8"), Loader=yaml.CSafeLoader)
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise TokenError(f"{path}: cannot read the tokens file ({type(exc).__name__})") from exc
        entries = doc.get("tokens") if isinstance(doc, dict) else None
        if not isinstance(entries, list):
            raise TokenError(f"{path}: expected 'tokens: [{{name, token, scopes}}]'")
        for i, entry in enumerate(entries):
            where = f"{path}: tokens[{i}]"
            if (
                not isinstance(entry, dict)
                or not isinstance(entry.get("name"), str)
                or not isinstance(entry.get("token"), str)
            ):
                raise TokenError(f"{where}: needs a 'name' and a 'token' (strings)")
            scopes = entry.get("scopes", ["read"])
            if (
                not isinstance(scopes, list)
                or not scopes
                or not all(isinstance(x, str) and x in SCOPES for x in scopes)
            ):
                raise TokenError(f"{where}: scopes are a list of {sorted(SCOPES)}")
            check_secret(entry["token"], where=f"{where} ({entry['name']})")
            tokens.append(Token(name=entry["name"], secret=entry["token"], scopes=frozenset(scopes)))
    secret = env.get("GPUFED_TOKEN")
    if secret:
        check_secret(secret, where="GPUFED_TOKEN")
        tokens.append(Token(name="env", secret=secret, scopes=SCOPES))
    reader = env.get("GPUFED_READ_TOKEN")
    if reader:  # the chart's own readers (tree-sync) carry it: their install never throttles them
        check_secret(reader, where="GPUFED_READ_TOKEN")
        tokens.append(Token(name="env-read", secret=reader, scopes=frozenset({"read"})))
    return tokens


class Authenticator:
    def __init__(self, tokens: list[Token], *, dev: bool = False) -> None:
        self._tokens = tokens
        self.dev = dev and not tokens

    def caller(self, authorization: str | None) -> Caller | None:
        """The caller a ``Bearer`` header names, or None (dev mode: everyone is ``dev``)."""
        if self.dev:
            return DEV_CALLER
        scheme, _, credentials = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not credentials.strip():  # RFC 9110: schemes ignore case
            return None
        given = credentials.strip().encode()
        found: Caller | None = None
        for token in self._tokens:  # compare with every token, so timing says nothing
            if hmac.compare_digest(given, token.secret.encode()):
                found = Caller(name=token.name, scopes=token.scopes)
        return found

    def secrets(self) -> list[str]:
        return [t.secret for t in self._tokens]
