"""The review page in real headless Chromium: sign in, list, open, label, calibration, export, access."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, Route, expect

from tests.live_server import LiveServer
from tests.review_server import HOSTILE_ANSWER, HOSTILE_CHUNK, TOKENS, review_server
from tests.ui.pages import wait_for_path

# pytest-base-url (a pytest-playwright dependency) declares its session fixture in a way
# pytest 9 deprecates; the warning is about that plugin, not about this code.
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::pytest.PytestRemovedIn10Warning")]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with review_server(tmp_path_factory.mktemp("review-ui")) as running:
        yield running


def sign_in(page: Page, server: LiveServer, reviewer: str) -> None:
    page.goto(server.url + "/review/login")
    page.fill("#token", TOKENS[reviewer])
    page.keyboard.press("Enter")
    wait_for_path(page, server.url, "/review")
    expect(page.locator("#who")).to_contain_text(reviewer)


def item_id(server: LiveServer, tenant: str, queue: str, trace: int) -> int:
    found = server.pipeline.reviews.find(tenant, queue, f"{0xC0FFEE000 + trace:032x}")  # type: ignore[arg-type]
    assert found is not None
    return found.id


def test_sign_in_label_a_blind_item_by_keyboard_see_calibration_and_export(
    page: Page, tmp_path: Path
) -> None:
    with review_server(tmp_path) as server:
        sign_in(page, server, "alice")
        expect(page.locator("#calibration tbody")).to_contain_text("No reviewed judged traces yet")
        expect(page.locator('#progress tr[data-queue="blind"] .open')).to_have_text("2")
        page.select_option("select[name=queue]", "blind")
        rows = page.locator("#items tbody tr")
        expect(rows).to_have_count(2)
        # keyboard: j moves the selection, k back, Enter opens the selected item
        expect(rows.nth(0)).to_have_class("state-open selected")
        page.keyboard.press("j")
        expect(rows.nth(1)).to_have_class("state-open selected")
        page.keyboard.press("k")
        first = rows.nth(0).get_attribute("data-id")
        page.keyboard.press("?")
        expect(page.locator("#help")).to_be_visible()
        page.keyboard.press("?")
        page.keyboard.press("Enter")
        page.wait_for_url(f"**/review/items/{first}?*")
        expect(page.locator("#lease")).to_contain_text("claimed by you")
        expect(page.locator("#judgment")).to_contain_text("blind calibration sample")
        page.keyboard.press("u")
        expect(page.locator("input[value=unfaithful]")).to_be_checked()
        page.fill("textarea[name=reference_answer]", "Refunds take 30 days.")
        page.fill("input[name=category]", "refunds")
        page.locator("#chunks button").first.click()
        # the judge's claims are listed to mark (without its marks): every one or none
        marks = page.locator("select[data-claim-mark]")
        expect(page.locator("#claim-marks")).to_be_visible()
        claims = marks.count()
        assert claims >= 1
        marks.nth(0).select_option("unsupported")
        if claims > 1:
            page.locator("body").click(position={"x": 5, "y": 5})
            page.keyboard.press("Enter")
            expect(page.locator("#status")).to_contain_text("Mark every claim, or none")
            for n in range(1, claims):
                marks.nth(n).select_option("unsupported")
        page.locator("body").click(position={"x": 5, "y": 5})
        page.keyboard.press("Enter")
        # saved: the page moves on to the next blind item
        page.wait_for_url(lambda url: f"/review/items/{first}?" not in url)
        stored = server.pipeline.reviews.review_of(int(first or 0))
        assert stored is not None and stored.review.claims_supported == (False,) * claims
        page.goto(server.url + "/review")
        expect(page.locator('#calibration tr[data-sample="blind"] .pairs')).to_have_text("1")
        expect(page.locator('#progress tr[data-queue="blind"] .done')).to_have_text("1")
        with page.expect_download() as download:
            page.click("#export")
        rows_out = [json.loads(line) for line in Path(download.value.path()).read_text().splitlines()]
        assert [(r["reviewer"], r["reference_answer"], r["category"]) for r in rows_out] == [
            ("alice", "Refunds take 30 days.", "refunds")
        ]
        assert rows_out[0]["gold_chunks"][0]["chunk_id"].startswith("policy-")


def test_a_second_reviewer_cannot_claim_an_item_someone_holds(browser: Browser, server: LiveServer) -> None:
    target = item_id(server, "acme", "flagged", 2)
    alice = browser.new_context().new_page()
    bob = browser.new_context().new_page()
    try:
        sign_in(alice, server, "alice")
        alice.goto(f"{server.url}/review/items/{target}")
        expect(alice.locator("#lease")).to_contain_text("claimed by you")
        sign_in(bob, server, "bob")
        bob.goto(f"{server.url}/review/items/{target}")
        expect(bob.locator("#status")).to_contain_text("Claimed by alice")
        expect(bob.locator("#submit")).to_be_disabled()
        alice.click("#release")
        wait_for_path(alice, server.url, "/review")
    finally:
        alice.context.close()
        bob.context.close()


def test_a_reviewer_of_another_tenant_gets_404_by_url(page: Page, server: LiveServer) -> None:
    sign_in(page, server, "carol")
    expect(page.locator("#items tbody tr")).not_to_have_count(0)
    for row in page.locator("#items tbody td:nth-child(3)").all_inner_texts():
        assert row == "bank"
    response = page.goto(f"{server.url}/review/items/{item_id(server, 'acme', 'flagged', 2)}")
    assert response is not None and response.status == 404
    expect(page.locator("h1")).to_have_text("Not found")


def test_hostile_answers_and_chunks_render_as_inert_text(page: Page, server: LiveServer) -> None:
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    sign_in(page, server, "alice")
    page.goto(f"{server.url}/review/items/{item_id(server, 'acme', 'flagged', 2)}")
    expect(page.locator("#answer")).to_contain_text(HOSTILE_ANSWER)
    expect(page.locator("#chunks .chunk-content")).to_have_text(HOSTILE_CHUNK)
    expect(page.locator("#judge-verdict")).to_have_text("unfaithful")
    expect(page.locator("#answer mark.claim.unsupported")).not_to_have_count(0)
    assert page.locator("#answer img, #answer script, #chunks img, #chunks script").count() == 0
    # trace text is direction-isolated: bidi controls in it cannot reorder the page around it
    for selector in ("#answer", "#question", "#chunks .chunk-content", "#answer mark.claim"):
        assert page.locator(selector).first.get_attribute("dir") == "auto", selector
    page.click("#release")
    wait_for_path(page, server.url, "/review")
    assert dialogs == []


def test_release_clicked_while_the_claim_is_in_flight_leaves_the_item_open(
    page: Page, server: LiveServer
) -> None:
    """On a slow server the item shows before its claim answers: a release clicked then must still
    give the item back (before, the click was lost and the claim then held the item for its lease)."""
    target = item_id(server, "acme", "blind", 1)
    held: list[Route] = []
    page.route(f"**/api/v1/review/items/{target}/claim", lambda route: held.append(route))
    sign_in(page, server, "alice")
    page.goto(f"{server.url}/review/items/{target}")
    expect(page.locator("#question")).not_to_be_empty()
    for _ in range(100):  # the route handler runs while Playwright waits
        if held:
            break
        page.wait_for_timeout(50)
    assert len(held) == 1
    page.click("#release")
    assert server.pipeline.reviews.get(target, ["acme"]).state == "open"  # type: ignore[union-attr]
    held[0].continue_()
    wait_for_path(page, server.url, "/review")
    item = server.pipeline.reviews.get(target, ["acme"])
    assert item is not None and item.state == "open" and item.reviewer is None
