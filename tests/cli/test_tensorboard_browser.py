"""TensorBoard as a person sees it: a real `bnn compare` run served by TensorBoard on loopback,
opened in headless Chromium. The scalars dashboard must list both twins' runs and the tags a
user compares them by, and a tag filter must bring up the test-accuracy chart.

Needs Chromium (Debian package `chromium`) and Playwright (`pip install playwright`, in bnn's
dev extra; Playwright drives the installed Chromium, it downloads no browser). Skipped, with the
reason, where either is missing. The screenshots are kept in the test's temporary folder, or in
``$BNN_SCREENSHOT_DIR`` when that is set.
"""

import os
import shutil
from pathlib import Path

import pytest

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
RUNS = ("binary/train", "float/train")
TAGS = ("epoch_test_accuracy", "epoch_loss", "epoch_step_time_ms", "epoch_flip_ratio")


@pytest.fixture(scope="module")
def tensorboard(tmp_path_factory):
    """A finished `bnn compare` run, served by TensorBoard on a loopback port."""
    tmp = tmp_path_factory.mktemp("browser")
    run_dir = tmp / "run"
    config = write_config(tmp / "tiny.yaml", tiny_config(seed=4, epochs=3))
    assert run_cli("compare", config, "--output-dir", run_dir) == 0
    with tensorboard_server(run_dir) as url:
        yield url, tmp


def test_scalars_dashboard_shows_both_twins_and_their_tags(tensorboard):
    url, tmp = tensorboard
    shots = Path(os.environ.get("BNN_SCREENSHOT_DIR") or tmp)
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{url}/#scalars")
            for run in RUNS:  # the run selector lists each twin's training run
                page.get_by_text(run, exact=True).wait_for(state="visible", timeout=90_000)
            for tag in TAGS:  # a pane per tag
                page.get_by_text(tag, exact=True).first.wait_for(state="visible",
                                                                 timeout=30_000)
            page.screenshot(path=str(shots / "tensorboard-scalars.png"))

            # Filter the tags as a person would, and wait for the test-accuracy chart to draw.
            page.get_by_label("Filter tags").fill("test_accuracy")
            card = page.locator("tf-scalar-card", has_text="tag: epoch_test_accuracy").first
            lines = card.locator("path.line")
            lines.first.wait_for(state="attached", timeout=60_000)
            page.wait_for_timeout(1000)  # the chart's transition
            assert lines.count() >= len(RUNS)  # one line per twin (and their smoothed lines)
            ticks = [card.locator("svg text").nth(i).text_content()
                     for i in range(card.locator("svg text").count())]
            fractions = [t for t in ticks if t.startswith("0.") and t[2:].isdigit()]
            assert len(fractions) >= 3, ticks  # an accuracy axis: ticks between 0 and 1
            page.screenshot(path=str(shots / "tensorboard-test-accuracy.png"))
        finally:
            browser.close()
    assert (shots / "tensorboard-scalars.png").stat().st_size > 10_000
