"""The evaluation report in a real headless browser (Debian's chromium): it renders without errors, every
figure decodes, and a screenshot shows the figures; both as a page of its own and the way the KFP UI shows an
HTML artifact (srcdoc of an iframe sandboxed with allow-scripts only).

`make test` needs chromium installed (`apt-get install chromium`); without it these tests are skipped, saying so.

To regenerate the README's screenshot from a model and a dataset:

    python -m tests.test_report_browser MODEL_DIR DATASET_DIR docs/report.png [--champion-model-dir DIR]
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
         "--disable-extensions", "--mute-audio"]

# The start of a probe: records script errors, failed resources and console errors in `errors`.
RECORD_ERRORS = """
  var errors = [];
  window.addEventListener('error', function (e) {
    var t = e.target;
    errors.push(t && t !== window ? 'resource failed: ' + (t.currentSrc || t.src || t.href || t.tagName).slice(0, 80)
                                  : 'script error: ' + e.message);
  }, true);
  var consoleError = console.error;
  console.error = function () { errors.push('console.error: ' + [].join.call(arguments, ' ')); consoleError.apply(console, arguments); };
"""

# Injected at the top of a copy of the page: records errors, and on load writes what every <img> decoded to into
# the DOM, where --dump-dom can read it back.
PROBE = """<script>
(function () {""" + RECORD_ERRORS + """
  window.addEventListener('load', function () {
    var report = {
      title: document.title,
      errors: errors,
      images: [].map.call(document.images, function (img) {
        var box = img.getBoundingClientRect();
        return {alt: img.alt, complete: img.complete, naturalWidth: img.naturalWidth, naturalHeight: img.naturalHeight,
                shownWidth: Math.round(box.width), shownHeight: Math.round(box.height),
                top: Math.round(box.top + window.scrollY), left: Math.round(box.left + window.scrollX)};
      }),
      headings: [].map.call(document.querySelectorAll('h2'), function (h) { return h.textContent; }),
      tableRows: document.querySelectorAll('table tr').length,
      decision: (document.querySelector('.decision') || {}).textContent || '',
      pageWidth: document.documentElement.scrollWidth, viewportWidth: window.innerWidth
    };
    if (window.parent !== window) { window.parent.postMessage(JSON.stringify(report), '*'); }
    else { var out = document.createElement('pre'); out.id = 'probe'; out.textContent = JSON.stringify(report);
           document.body.appendChild(out); }
  });
})();
</script>"""

# The KFP UI's HTML viewer: <iframe sandbox="allow-scripts"> whose srcdoc is the artifact's content.
KFP_FRAME = """<!doctype html><html><head><meta charset="utf-8"><title>KFP HTML viewer</title></head>
<body style="margin:0"><iframe id="viewer" sandbox="allow-scripts" style="border:1px solid #ccc;box-sizing:border-box;
width:100%;min-height:600px;height:{height}px" srcdoc="{srcdoc}"></iframe>
<script>window.addEventListener('message', function (e) {{
  var out = document.createElement('pre'); out.id = 'probe'; out.textContent = e.data; document.body.appendChild(out);
}});</script></body></html>"""


def find_browser() -> str | None:
    return next((path for path in map(shutil.which, BROWSERS) if path), None)


def run_browser(browser: str, arguments: list[str], timeout: int = 120) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        return subprocess.run([browser, *FLAGS, f"--user-data-dir={profile}", *arguments], capture_output=True,
                              text=True, timeout=timeout)


def probe(browser: str, page: str, work: str, *, in_kfp_frame: bool = False, script: str = PROBE,
          height: int = 3600) -> dict:
    """Loads `page` (HTML text) with the probe `script` and returns what the probe saw (the JSON it writes into
    <pre id="probe">, or posts to the frame's parent)."""
    with_probe = page.replace("<head>", "<head>" + script, 1)
    assert with_probe != page, "the report has no <head>"
    if in_kfp_frame:
        with_probe = KFP_FRAME.format(height=4000, srcdoc=html.escape(with_probe, quote=True))
    path = os.path.join(work, "kfp-frame.html" if in_kfp_frame else "probe.html")
    with open(path, "w") as f:
        f.write(with_probe)
    # Headless Chromium dumps the DOM when the virtual time budget runs out; on a loaded machine the sandboxed
    # frame's report has once not posted within 15 s of it (a CI run, passing alone), so a second load gets 60 s.
    for budget in (15000, 60000):
        completed = run_browser(browser, [f"--virtual-time-budget={budget}", f"--window-size=1280,{height}",
                                          "--dump-dom", "file://" + path])
        assert completed.returncode == 0, completed.stderr[-2000:]
        found = re.search(r'<pre id="probe">(.*?)</pre>', completed.stdout, re.S)
        if found:
            break
    assert found, f"the probe never reported (page did not load?):\n{completed.stdout[-1500:]}"
    return json.loads(html.unescape(found.group(1)))


def screenshot(browser: str, page_path: str, png_path: str, width: int = 1280, height: int = 3600) -> None:
    completed = run_browser(browser, [f"--window-size={width},{height}", f"--screenshot={png_path}",
                                      "file://" + os.path.abspath(page_path)])
    if completed.returncode != 0 or not os.path.exists(png_path):
        raise RuntimeError(f"chromium could not take the screenshot:\n{completed.stderr[-2000:]}")


def readme_screenshot(write_page, png_path: str, height: int) -> int:
    """The scripts' (`main`) part: `write_page(work_dir)` writes the page and returns its path, whose screenshot
    `png_path` gets in 256 colours (for the docs); the exit code (2: no browser)."""
    from PIL import Image

    browser = find_browser()
    if not browser:
        print("chromium is not installed (apt-get install chromium)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as work:
        full = os.path.join(work, "full.png")
        screenshot(browser, write_page(work), full, height=height)
        Image.open(full).convert("RGB").quantize(colors=256).save(png_path, optimize=True)
    return 0


# ---------------------------------------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def report(tiny_model, small_dataset, tmp_path_factory):
    from components.evaluate import evaluate, write_report

    result = evaluate(tiny_model, small_dataset, min_accuracy=0.5, min_class_recall=0.6,
                      champion_model_dir=tiny_model, champion_version="1", tolerance=0.005)
    path = str(tmp_path_factory.mktemp("report") / "report.html")
    write_report(result, tiny_model, small_dataset, path)
    with open(path) as f:
        return path, f.read(), result


FIGURES = ["Training curves", "Confusion matrix", "Per class", "Most confidently wrong test images"]


def test_report_renders_without_errors(browser, report, tmp_path):
    path, page, result = report
    seen = probe(browser, page, str(tmp_path))
    assert seen["errors"] == []
    assert seen["title"] == "Evaluation report"
    assert seen["headings"] == FIGURES
    assert [image["alt"] for image in seen["images"]] == FIGURES
    for image in seen["images"]:
        assert image["complete"] and image["naturalWidth"] > 300 and image["naturalHeight"] > 150, image
        assert 0 < image["shownWidth"] <= seen["viewportWidth"], image  # scaled to the page, never cut off
    assert seen["pageWidth"] <= seen["viewportWidth"]
    assert seen["tableRows"] == len(result.class_names) + 1
    assert seen["decision"] == result.decision


def test_report_renders_in_the_kfp_uis_sandboxed_frame(browser, report, tmp_path):
    _, page, result = report
    seen = probe(browser, page, str(tmp_path), in_kfp_frame=True)
    assert seen["errors"] == []
    assert [image["alt"] for image in seen["images"]] == FIGURES
    assert all(image["complete"] and image["naturalWidth"] > 300 for image in seen["images"])
    assert seen["decision"] == result.decision


def test_screenshot_shows_the_figures(browser, report, tmp_path):
    """Each figure, cut out of the screenshot where the browser laid it out, shows what it should."""
    from PIL import Image

    path, page, result = report
    layout = {image["alt"]: image for image in probe(browser, page, str(tmp_path))["images"]}
    png = str(tmp_path / "report.png")
    screenshot(browser, path, png, width=1280, height=3600)
    pixels = np.asarray(Image.open(png).convert("RGB"))
    assert pixels.shape == (3600, 1280, 3)

    def figure(title: str) -> np.ndarray:
        box = layout[title]
        assert box["top"] + box["shownHeight"] <= 3600, f"{title} is below the screenshot"
        return pixels[box["top"]:box["top"] + box["shownHeight"], box["left"]:box["left"] + box["shownWidth"]]

    def share(region: np.ndarray, rgb: tuple[int, int, int], tolerance: int = 16) -> float:
        return float(np.mean(np.all(np.abs(region.astype(int) - rgb) <= tolerance, axis=-1)))

    def blue(region: np.ndarray) -> float:  # cells of the Blues heatmap, from light to dark
        r, g, b = (region[..., i].astype(int) for i in range(3))
        return float(np.mean((b - r > 40) & (b > 100)))

    curves = figure("Training curves")
    assert share(curves, (31, 119, 180)) > 0.002 and share(curves, (255, 127, 14)) > 0.002  # train, validation
    assert blue(figure("Confusion matrix")) > 0.08
    bars = figure("Per class")
    for colour in ((76, 120, 168), (245, 133, 24), (84, 162, 75)):  # precision, recall, F1
        assert share(bars, colour) > 0.01, colour
    grid = figure("Most confidently wrong test images")
    assert share(grid, (0, 0, 0), 8) > 0.15  # the images' black backgrounds
    assert share(grid, (179, 38, 30), 40) > 0.0005  # the red true/predicted captions (short names: few pixels)
    banner = pixels[:layout["Training curves"]["top"]]
    background = (230, 244, 234) if result.blessed else (252, 232, 230)  # the decision: green or red
    assert share(banner, background, 3) > 0.005


# ---------------------------------------------------------------------------------------------- README


def main(argv: list[str] | None = None) -> int:
    """Writes the report of MODEL_DIR on DATASET_DIR and its screenshot (for the README)."""
    import argparse

    from components.evaluate import evaluate, write_report

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("model_dir")
    parser.add_argument("dataset_dir")
    parser.add_argument("png")
    parser.add_argument("--champion-model-dir")
    parser.add_argument("--champion-version", default="1")
    parser.add_argument("--min-accuracy", type=float, default=0.8)
    parser.add_argument("--tolerance", type=float, default=0.005)
    parser.add_argument("--height", type=int, default=2900, help="pixels of the page to keep")
    args = parser.parse_args(argv)
    result = evaluate(args.model_dir, args.dataset_dir, min_accuracy=args.min_accuracy,
                      champion_model_dir=args.champion_model_dir, champion_version=args.champion_version,
                      tolerance=args.tolerance)

    def write_page(work: str) -> str:
        write_report(result, args.model_dir, args.dataset_dir, os.path.join(work, "report.html"))
        return os.path.join(work, "report.html")

    written = readme_screenshot(write_page, args.png, args.height)
    if written == 0:
        print(f"{args.png}: {result.decision}")
    return written


if __name__ == "__main__":
    raise SystemExit(main())
