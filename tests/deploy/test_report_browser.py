"""report.html rendered by a real headless Chromium (Debian's package, driven by Playwright, no network).

The page must load with no console error, and each plotly chart must be drawn: an SVG with its marks
(bars, pie slices) inside the chart's div, and a screenshot that is not blank.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
from PIL import Image

from zonnx.deploy.report_html import WORST_LAYERS

CHARTS = {
    "accuracy-chart": 3,
    "layers-chart": 5,
    "histograms-chart": 20,
    "partition-chart": 2,
    "profile-chart": 5,
}


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, (
        "Debian's chromium is not installed: run `bash tools/dev.sh test` (it installs it) or apt-get install chromium"
    )
    return path


def test_report_renders_every_chart_in_chromium(digits_build) -> None:
    from playwright.sync_api import sync_playwright

    _, run = digits_build
    page_path = Path(run.out_dir) / "report.html"
    text = page_path.read_text()
    assert "<script src=" not in text and "https://" not in text.split("<script", 1)[0]  # nothing fetched
    errors: list[str] = []
    requests: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on(
                "request",
                lambda r: requests.append(r.url) if not r.url.startswith(("file:", "data:")) else None,
            )
            page.goto(page_path.as_uri())
            page.wait_for_selector("#profile-chart .main-svg", timeout=15000)
            marks = page.evaluate(
                "ids => Object.fromEntries(ids.map(id => [id, document.querySelectorAll("
                "'#' + id + ' .main-svg .point, #' + id + ' .main-svg .slice').length]))",
                list(CHARTS),
            )
            clip_lines = page.evaluate("document.querySelectorAll('#histograms-chart .shapelayer path').length")
            shot = page.screenshot(full_page=True)
        finally:
            browser.close()
    assert errors == [] and requests == []
    hists = json.loads((Path(run.out_dir) / "layer_histograms.json").read_text())
    assert len(hists) == WORST_LAYERS and clip_lines == 2 * WORST_LAYERS  # each histogram's clipping range
    for chart, least in CHARTS.items():
        assert marks[chart] >= least, (chart, marks)
    pixels = np.asarray(Image.open(io.BytesIO(shot)).convert("RGB"))
    colors = np.unique(pixels.reshape(-1, 3), axis=0)
    assert len(colors) > 50 and pixels.std() > 10  # drawn charts, not a blank page
