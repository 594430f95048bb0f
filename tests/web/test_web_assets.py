"""The page's files as the controller serves them, without a browser (fast).

The browser test proves the page works; these pin what keeps it safe and shippable:
only flat ``/web/<name>.css|js`` files are served, the page carries a CSP without inline
code, and the page's code never parses API strings as markup.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest
from conftest import ROOT

from federation.controller.http.api import WEB_DIR
from federation.controller.http.service import ServeSettings, build_service
from federation.spec import load_gpufed_spec

Get = Callable[[str], httpx.Response]


@pytest.fixture
def get(tmp_path: Path) -> Iterator[Get]:
    """GET against the controller's app in-process (httpx's ASGI transport)."""
    spec = load_gpufed_spec(ROOT / "examples" / "federation.yaml")
    token = secrets.token_hex(24)
    settings = ServeSettings(
        spec=spec, data_dir=tmp_path / "data", check_configs=False, env={"GPUFED_TOKEN": token}
    )
    service = build_service(settings)

    async def fetch(path: str) -> httpx.Response:
        transport = httpx.ASGITransport(app=service.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://controller") as client:
            return await client.get(path)

    try:
        yield lambda path: asyncio.run(fetch(path))
    finally:
        service.stop()


class _Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []
        self.inline: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        if tag == "script" and not named.get("src"):
            self.inline.append("<script> without src")
        for name, value in attrs:
            if name == "style" or name.startswith("on"):
                self.inline.append(f"<{tag} {name}=...>")
            if name in {"src", "href"} and value and value.startswith("/web/"):
                self.refs.append(value)


def test_page_and_assets_are_served_with_a_strict_policy(get: Get) -> None:
    page = get("/")
    assert page.status_code == 200
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy
    parser = _Refs()
    parser.feed(page.text)
    assert parser.inline == [], "the CSP forbids inline code; move it to web/app.js or app.css"
    assert sorted(parser.refs) == ["/web/app.css", "/web/app.js"]
    for ref, media in (("/web/app.css", "text/css"), ("/web/app.js", "text/javascript")):
        response = get(ref)
        assert response.status_code == 200, ref
        assert response.headers["content-type"].startswith(media)
        assert response.content == (WEB_DIR / ref.removeprefix("/web/")).read_bytes()


@pytest.mark.parametrize("name", ["index.html", "__init__.py", "missing.js", "..%2Fapi.py", "%2E%2E"])
def test_only_flat_css_and_js_files_are_served(get: Get, name: str) -> None:
    response = get(f"/web/{name}")
    assert response.status_code == 404
    assert response.headers["content-type"].startswith("application/problem+json")


def test_the_script_never_parses_strings_as_markup() -> None:
    script = (WEB_DIR / "app.js").read_text(encoding="utf-8")
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in script, f"app.js uses {sink}: insert API values with el()/textContent only"
    assert not re.search(r"setAttribute\(\s*[\"']style", script)
