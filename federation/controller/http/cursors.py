"""Listing cursors: a page continues after the last identity it showed, not at an offset.

Offsets skip or repeat rows when the set changes between two pages (a row added before the
offset pushes one row over the page boundary twice). A cursor names the last identity the
previous page showed; the next page starts strictly after it in identity order, so a walk
over a changing set sees every identity that stayed, once. The cursor is opaque to clients
(URL-safe base64 of the identity) and answered 422 naming ``cursor`` when it does not decode.
"""

from __future__ import annotations

import base64
import binascii

from federation.controller.base.errors import Invalid

MAX_CURSOR = 1400
"""Characters: the base64 of the longest identity a listing holds."""


def encode(identity: str) -> str:
    return base64.urlsafe_b64encode(identity.encode()).decode().rstrip("=")


def decode(cursor: str) -> str:
    try:
        return base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise Invalid(
            f"cursor: not a cursor this controller gave ({len(cursor)} characters); "
            "use next_cursor from the previous page",
            field="cursor",
        ) from None


def next_cursor(identities: list[str], *, limit: int) -> str | None:
    """The cursor of the page after ``identities`` (None: a short page, the last one)."""
    return encode(identities[-1]) if identities and len(identities) >= limit else None
