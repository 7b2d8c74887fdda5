"""TensorBoard as a person sees it: a real `bnn compare` run served by TensorBoard on loopback,
opened in headless Chromium. Time Series, the page TensorBoard opens on, must start with the
twins' test accuracy and step time; the custom-scalars tab must draw both twins on one chart per
figure; the hparams tab must list both twins.

Needs Chromium (Debian package `chromium`) and Playwright (`pip install playwright`, in bnn's
dev extra; Playwright drives the installed Chromium, it downloads no browser). Skipped, with the
reason, where either is missing. The screenshots are kept in the test's temporary folder, or in
``$BNN_SCREENSHOT_DIR`` when that is set. With ``$BNN_TENSORBOARD_RUN`` set to the directory
of a finished `bnn compare` run, the tests look at that run instead of training a tiny one (the
docs' screenshots are of the main job's run, taken so).
"""

import os
import re
import shutil
from pathlib import Path

import pytest
import yaml

from support import needs_mnist, run_cli, tensorboard_server, tiny_config, write_config

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - depends on the environment
    sync_playwright = None

pytestmark = [
    needs_mnist,
    pytest.mark.skipif(CHROMIUM is None, reason="no Chromium browser installed (Debian: "
                                                "apt-get install chromium)"),
    pytest.mark.skipif(sync_playwright is None, reason="Playwright is not installed "
                                                       "(pip install playwright)"),
]

# As a root user in a container with no network: no sandbox, nothing fetched in the background.
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync"]
VIEWPORT = {"width": 1400, "height": 1000}
TWINS = ("binary", "float")


@pytest.fixture(scope="module")
def tensorboard(tmp_path_factory):
    """A finished `bnn compare` run (a new tiny one, or the one in ``$BNN_TENSORBOARD_RUN``),
    served by TensorBoard on a loopback port; the folder for screenshots; the experiment's
    name."""
    tmp = tmp_path_factory.mktemp("browser")
    run_dir = Path(os.environ.get("BNN_TENSORBOARD_RUN") or tmp / "run")
    if not os.environ.get("BNN_TENSORBOARD_RUN"):
        config = write_config(tmp / "tiny.yaml", tiny_config(seed=4, epochs=3))
        assert run_cli("compare", config, "--output-dir", run_dir) == 0
    name = yaml.safe_load((run_dir / "config.yaml").read_text())["name"]
    shots = Path(os.environ.get("BNN_SCREENSHOT_DIR") or tmp)
    shots.mkdir(parents=True, exist_ok=True)
    with tensorboard_server(run_dir) as url:
        yield url, shots, name


@pytest.fixture
def page():
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            yield browser.new_page(viewport=VIEWPORT)
        finally:
            browser.close()


def test_time_series_opens_on_the_twins_test_accuracy_and_step_time(tensorboard, page):
    url, shots, _ = tensorboard
    page.goto(url)  # no dashboard named: TensorBoard's first, Time Series
    for twin in TWINS:  # the run selector lists each twin by its name
        page.get_by_text(twin, exact=True).first.wait_for(state="visible", timeout=90_000)
    cards = page.locator("card-view")
    cards.first.wait_for(state="visible", timeout=60_000)
    page.wait_for_timeout(2000)  # the cards' data and the lazy rendering of the grid
    first_screen = []
    for i in range(cards.count()):
        box = cards.nth(i).bounding_box()
        if box is not None and box["y"] < VIEWPORT["height"]:
            title = cards.nth(i).locator("tb-truncated-path").first.inner_text()
            first_screen.append((re.sub(r"\s+", "", title), cards.nth(i)))
    page.screenshot(path=str(shots / "tensorboard-time-series.png"))
    titles = [title for title, _ in first_screen]
    assert titles[0] == "accuracy/test", titles
    assert "cost/step_time_ms" in titles, titles
    assert set(titles) <= {"accuracy/test", "accuracy/train", "cost/step_time_ms"}, titles
    for title, card in first_screen:  # each chart's table has a row per twin
        text = card.inner_text()
        assert all(re.search(rf"\b{twin}\b", text) for twin in TWINS), (title, text)


def test_custom_scalars_draw_both_twins_on_one_chart_per_figure(tensorboard, page):
    url, shots, _ = tensorboard
    page.goto(f"{url}/#custom_scalars")
    charts = page.locator("tf-custom-scalar-multi-line-chart-card")
    charts.first.wait_for(state="visible", timeout=90_000)
    page.get_by_text("binary vs float").first.wait_for(state="visible", timeout=30_000)

    def matches(title: str) -> list[str]:
        chart = charts.filter(has=page.locator("tf-card-heading", has_text=title)).first
        chart.locator("path.line").first.wait_for(state="attached", timeout=60_000)
        entries = chart.locator(".match-list-entry")
        return sorted(re.sub(r"[◼\s]+", " ", entries.nth(i).text_content()).strip()
                      for i in range(entries.count()))

    assert matches("test accuracy") == ["accuracy/test (binary)", "accuracy/test (float)"]
    assert matches("train step (ms)") == ["cost/step_time_ms (binary)",
                                          "cost/step_time_ms (float)"]
    assert matches("training loss") == ["loss/train (binary)", "loss/train (float)"]
    assert matches("flip ratio") == ["flips/all (binary)"]  # the float twin has no flips
    page.wait_for_timeout(1000)  # the charts' transitions
    page.screenshot(path=str(shots / "tensorboard-custom-scalars.png"))
    assert (shots / "tensorboard-custom-scalars.png").stat().st_size > 10_000


def test_hparams_lists_both_twins_with_their_settings_and_test_accuracy(tensorboard, page):
    url, shots, name = tensorboard
    page.goto(f"{url}/#hparams")
    for twin in TWINS:
        page.get_by_text(f"{name}/{twin}", exact=True).wait_for(state="visible", timeout=90_000)
    for column in ("model.precision", "test accuracy", "train step (ms)"):
        page.get_by_text(column, exact=True).first.wait_for(state="visible", timeout=30_000)
    page.screenshot(path=str(shots / "tensorboard-hparams.png"))
