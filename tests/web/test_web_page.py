"""The controller's web page in a real browser (Debian's chromium driven by playwright).

A controller from ``build_service`` serves the example fleet (620 targets, 26 shards)
under uvicorn; fake children answer its health probes from its own HTTP SD. The page
must show every shard, plan a change and show it before applying, apply it with the
token, then show the new shard, the hand-overs and the audit entry by itself.

The screenshot lands in the test's tmp dir; ``GPUFED_REGEN_GOLDEN=1`` also refreshes
docs/web-page.png. Run: ``pytest tests/web`` (scripts/bootstrap.sh installs chromium).
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import ROOT
from live_controller import LiveController, live_controller
from PIL import Image
from playwright.sync_api import Browser, Locator, Page, expect, sync_playwright

from federation.spec import load_gpufed_spec

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
WAIT_MS = 45_000
"""Generous: the page polls every few seconds and this machine may be busy."""
DOWN = "10.11.0.12:9400"
"""One GPU exporter every child reports down: its shard must show as degraded."""
SCREENSHOT = ROOT / "docs" / "web-page.png"
REGEN = os.environ.get("GPUFED_REGEN_GOLDEN") == "1"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/bootstrap.sh, which installs Debian's chromium")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    expected = re.compile(r"Failed to load resource: .* status of (401|409)")  # the tests' own refusals
    try:
        yield page
    finally:
        context.close()
    unexpected = [e for e in errors if not expected.match(e)]
    assert not unexpected, f"the page logged errors: {unexpected}"


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveController]:
    spec = load_gpufed_spec(ROOT / "examples" / "federation.yaml")
    with live_controller(
        spec=spec,
        inventory=ROOT / "examples" / "inventory.yaml",
        data_dir=tmp_path / "data",
        token=secrets.token_hex(24),
        down={DOWN},
    ) as controller:
        yield controller


def save_for_docs(shot: Path) -> Path:
    """The docs' picture: the same screenshot in 256 colours (a third of the bytes).

    Written beside ``shot``; copied over docs/web-page.png only with GPUFED_REGEN_GOLDEN=1,
    like the golden files, so a test run leaves the checkout as it was.
    """
    small = shot.with_name("web-page-256.png")
    with Image.open(shot) as image:
        quantized = image.convert("RGB").quantize(
            colors=256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE
        )
    quantized.save(small, optimize=True)
    if REGEN:
        SCREENSHOT.parent.mkdir(exist_ok=True)
        SCREENSHOT.write_bytes(small.read_bytes())
    return small


def shard_row(page: Page, shard: str) -> Locator:
    return page.locator(f'tr[data-shard-row="{shard}"]')


def rebalance_entries(live: LiveController) -> list[dict[str, Any]]:
    return [e for e in live.get("/v1/audit")["entries"] if e["action"] == "rebalance"]


def plan_in_page(page: Page, *, region: str, token: str, reason: str = "") -> None:
    page.select_option("#plan-action", "add_shard")
    page.select_option("#plan-region", region)
    page.fill("#plan-reason", reason)
    page.fill("#token", token)
    page.click("#plan-button")


def test_page_shows_the_map_plans_applies_and_updates(
    live: LiveController, page: Page, tmp_path: Path
) -> None:
    shards = live.get("/v1/shards")["shards"]
    assert len(shards) == 26
    page.goto(live.url)

    # Every shard is on the map, with its target count.
    for row in shards:
        expect(shard_row(page, row["shard"]).locator("td").nth(1)).to_have_text(
            str(row["targets"]), timeout=WAIT_MS
        )
    expect(page.locator("#fact-shards")).to_have_text("26")

    # Health from the children: the shard holding the down target is degraded, others ok.
    down_shard = live.get(f"/v1/targets/{DOWN}")["shard"]
    expect(shard_row(page, down_shard).locator(".badge.degraded")).to_have_text("degraded", timeout=WAIT_MS)
    healthy = next(r["shard"] for r in shards if r["shard"] != down_shard)
    expect(shard_row(page, healthy).locator(".badge.ok")).to_have_text("ok", timeout=WAIT_MS)
    expect(page.locator("#discovery")).to_contain_text("file")

    # A shard's targets on click; the search finds one target with its health.
    page.click(f'button[data-shard="{healthy}"]')
    count = next(r["targets"] for r in shards if r["shard"] == healthy)
    expect(page.locator("#targets-count")).to_have_text(f"{count} targets on {healthy}", timeout=WAIT_MS)
    expect(page.locator("#targets tbody tr")).to_have_count(count)
    page.click("#shard-filter button")
    page.fill("#target-q", DOWN)
    found = page.locator("#targets tbody tr")
    expect(found).to_have_count(1, timeout=WAIT_MS)
    expect(found.locator(".badge")).to_have_text("down", timeout=WAIT_MS)

    # The plan is shown before anything is applied. The new shard's child "is starting",
    # so the hand-overs it gets stay in flight until the test lets it start.
    live.children.starting.add("cn-hangzhou-4")
    plan_in_page(page, region="cn-hangzhou", token=live.token, reason="more room in hangzhou")
    summary = page.locator("#plan-summary")
    expect(summary).to_contain_text("targets move", timeout=WAIT_MS)
    counted = re.match(r"(\d+) of 620 targets move", summary.inner_text())
    assert counted, summary.inner_text()
    moved = int(counted.group(1))
    assert moved > 0
    expect(page.locator(".plan .loads tbody tr", has_text="cn-hangzhou-4")).to_contain_text("new")
    expect(page.locator(".plan .moves tbody tr")).to_have_count(min(moved, 40))
    version = page.locator("#plan-version").inner_text()
    assert len(live.get("/v1/shards")["shards"]) == 26, "planning must not apply anything"
    assert rebalance_entries(live) == []

    # Apply with the token: the result, the new shard on the map, the audit entry.
    page.click("#apply-button")
    expect(page.locator("#apply-result .msg")).to_have_text(
        re.compile(rf"Applied plan {re.escape(version)}: {moved} target\(s\) moved"), timeout=WAIT_MS
    )
    expect(page.locator('button[data-shard="cn-hangzhou-4"]')).to_be_visible(timeout=WAIT_MS)
    expect(page.locator("#fact-shards")).to_have_text("27", timeout=WAIT_MS)
    first = page.locator("#audit li").first
    expect(first).to_contain_text("add a shard to cn-hangzhou", timeout=WAIT_MS)
    expect(first).to_contain_text("more room in hangzhou")
    expect(first).to_contain_text(f"{moved} moved")
    assert [e["moved"] for e in rebalance_entries(live)] == [moved]

    # Hand-overs wait for the new child; once it scrapes, the page clears them by itself.
    waiting = [h for h in live.get("/v1/handovers")["handovers"] if h["to_shard"] == "cn-hangzhou-4"]
    assert waiting
    expect(page.locator("#handovers tbody tr")).to_have_count(min(len(waiting), 40), timeout=WAIT_MS)
    expect(page.locator("#handovers tbody tr").first).to_contain_text("→ cn-hangzhou-4")
    page.fill("#target-q", "")
    page.click(f'button[data-shard="{down_shard}"]')
    down_count = next(r["targets"] for r in shards if r["shard"] == down_shard)
    expect(page.locator("#targets-count")).to_have_text(
        f"{down_count} targets on {down_shard}", timeout=WAIT_MS
    )
    expect(page.locator("#targets tbody tr", has_text=DOWN).locator(".badge")).to_have_text("down")
    page.evaluate("window.scrollTo(0, 0)")
    shot = tmp_path / "web-page.png"
    page.screenshot(path=str(shot), full_page=True)
    assert save_for_docs(shot).stat().st_size < 300_000
    live.children.starting.clear()
    expect(page.locator("#handovers")).to_have_text("No hand-overs in flight.", timeout=WAIT_MS)
    expect(page.locator("#fact-handovers")).to_have_text("0", timeout=WAIT_MS)


def test_wrong_token_stale_plan_and_markup(live: LiveController, page: Page) -> None:
    page.goto(live.url)
    expect(page.locator('button[data-shard="cn-beijing-0"]')).to_be_visible(timeout=WAIT_MS)
    wrong = secrets.token_hex(24)

    # A wrong token cannot even plan.
    plan_in_page(page, region="cn-beijing", token=wrong)
    expect(page.locator("#plan-result .msg.error")).to_contain_text("401 Unauthorized", timeout=WAIT_MS)
    expect(page.locator("#plan")).to_have_count(0)

    # A plan made with the right token is not applied with a wrong one.
    plan_in_page(page, region="cn-beijing", token=live.token)
    expect(page.locator("#plan-summary")).to_contain_text("targets move", timeout=WAIT_MS)
    page.fill("#token", wrong)
    page.click("#apply-button")
    expect(page.locator("#apply-result .msg.error")).to_contain_text("401 Unauthorized", timeout=WAIT_MS)
    assert rebalance_entries(live) == []
    assert len(live.get("/v1/shards")["shards"]) == 26
    assert page.evaluate("sessionStorage.getItem('gpufed.token')") == wrong

    # Another change lands first (with markup in its reason): the page's plan is stale (409),
    # and the audit shows the reason as text.
    markup = '<img src=x onerror="window.__pwned = 1">'
    auth = {"Authorization": f"Bearer {live.token}"}
    other = httpx.post(
        f"{live.url}/v1/plan", json={"drain": ["cn-shanghai-0"], "reason": markup}, headers=auth, timeout=30
    )
    other.raise_for_status()
    httpx.post(
        f"{live.url}/v1/rebalance", json={"version": other.json()["version"]}, headers=auth, timeout=30
    ).raise_for_status()
    page.fill("#token", live.token)
    page.click("#apply-button")
    expect(page.locator("#apply-result .msg.error")).to_contain_text("409 Conflict", timeout=WAIT_MS)
    expect(page.locator("#apply-result .msg.error")).to_contain_text("plan again")
    first = page.locator("#audit li").first
    expect(first).to_contain_text("drain cn-shanghai-0", timeout=WAIT_MS)
    expect(first.locator(".audit-why")).to_have_text(f"“{markup}”")
    assert page.locator("#audit img").count() == 0
    assert page.evaluate("window.__pwned") is None
    expect(shard_row(page, "cn-shanghai-0").locator(".badge.drained")).to_be_visible(timeout=WAIT_MS)
    assert [e["detail"]["change"] for e in rebalance_entries(live)] == [
        {"drain": ["cn-shanghai-0"], "reason": markup}
    ]
