"""RUN_DIR/index.html, the page of a local run: its parts on their own, and the page of a real run (conftest's
`local_runs`) in headless Chromium, as tests/test_report_browser.py checks the evaluation report: every section
present, every image and embedded artifact decoded, nothing fetched, and a screenshot that shows them.

To regenerate the README's screenshot from a run directory (`make run RUN_DIR=runs/try` first):

    python -m tests.test_runpage runs/try docs/run-page.png
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

from pipelines.local import runpage
from tests.conftest import write_png
from tests.test_report_browser import RECORD_ERRORS, probe, readme_screenshot, screenshot

SECTIONS = ["Predictions", "Training curves", "GPU utilization", "TensorBoard", "Evaluation report", "Dataset card",
            "Augmentation preview"]

# Injected into a copy of the page: on load (after every frame loaded) it writes what the browser made of the
# page into the DOM, where --dump-dom reads it back.
PROBE = """<script>
(function () {""" + RECORD_ERRORS + """
  function decoded(img) { return img.complete && img.naturalWidth > 0; }
  window.addEventListener('load', function () {
    var frames = [].map.call(document.querySelectorAll('iframe'), function (f) {
      var doc = f.contentDocument;
      return {title: f.title, height: Math.round(f.getBoundingClientRect().height), page: doc ? doc.title : null,
              images: doc ? doc.images.length : -1, decoded: doc ? [].every.call(doc.images, decoded) : false};
    });
    var curves = document.querySelector("img[alt='Training curves']");
    var report = {
      errors: errors,
      headings: [].map.call(document.querySelectorAll('h2'), function (h) { return h.textContent; }),
      frames: frames,
      figures: document.querySelectorAll('.grid figure').length,
      gridDecoded: [].filter.call(document.querySelectorAll('.grid img'), decoded).length,
      captions: [].map.call(document.querySelectorAll('.grid figcaption'), function (c) { return c.innerText; }),
      curvesWidth: curves && decoded(curves) ? curves.naturalWidth : 0,
      decision: (document.querySelector('.decision') || {}).textContent || '',
      tensorboard: (document.querySelector('#tensorboard + pre') || {}).textContent || '',
      pageWidth: document.documentElement.scrollWidth, viewportWidth: window.innerWidth
    };
    var out = document.createElement('pre'); out.id = 'probe'; out.textContent = JSON.stringify(report);
    document.body.appendChild(out);
  });
})();
</script>"""


# ---------------------------------------------------------------------------------------------- its parts


def test_predicted_images_are_inlined_or_thumbnailed(tmp_path, fashion_arrays):
    images, _ = fashion_arrays
    small = str(tmp_path / "small.png")
    write_png(small, images[0])
    assert runpage.image_data_uri(small).startswith("data:image/png;base64,iVBOR")
    big = str(tmp_path / "photo.tiff")  # a format browsers do not show: a PNG thumbnail instead
    from PIL import Image

    Image.fromarray(np.random.default_rng(0).integers(0, 255, (600, 400, 3), dtype=np.uint8)).save(big)
    assert runpage.image_data_uri(big).startswith("data:image/png;base64,")
    (tmp_path / "broken.png").write_bytes(b"not an image at all" * 20000)
    assert runpage.image_data_uri(str(tmp_path / "broken.png")) is None
    assert runpage.image_data_uri("gs://bucket/a.png") is None
    assert runpage.image_data_uri(str(tmp_path / "shards-00000.tfrecord") + "#3") is None


def test_the_grid_names_what_it_cannot_show(tmp_path, fashion_arrays):
    write_png(str(tmp_path / "a.png"), fashion_arrays[0][1])
    rows = [{"uri": str(tmp_path / "a.png"), "class_name": "Bag", "confidence": 0.9},
            {"uri": "gs://bucket/b.png", "class_name": "Coat <2>", "confidence": 0.25}]
    path = tmp_path / "predictions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    grid = runpage._predictions(str(path), 7, str(tmp_path))
    assert "The first 2 of 7 predictions" in grid and grid.count("<figure") == 2
    assert "<a href='predictions.jsonl'>" in grid  # beside the page, which sits in the output directory
    assert "<b>Bag</b><br>90.0%" in grid and "<b>Coat &lt;2&gt;</b><br>25.0%" in grid
    assert "<div class='missing'>gs://bucket/b.png</div>" in grid


def test_the_training_curves_are_the_reports_own_figure():
    report = "<html><body><h2>Training curves</h2><img alt='Training curves' src='data:image/png;base64,AAAA'>" \
             "<img alt='Per class' src='data:image/png;base64,BBBB'></body></html>"
    assert runpage.figure_from(report, "Training curves") == "data:image/png;base64,AAAA"
    assert runpage.figure_from(report, "Confusion matrix") is None
    assert runpage.figure_from("<img alt='Training curves' src='http://example.com/x.png'>", "Training curves") is None


def test_near_copies_of_test_images_in_training_are_warned_about_under_the_decision():
    warning = "5 test images have near-copies in training or validation (5 groups not kept in one split: ...)"
    shown = runpage.near_duplicates_warning({"near_duplicates_warning": warning})
    assert shown.startswith(f"<p class='warning'><strong>Warning:</strong> {warning} (the dataset card's ")
    assert "<a href='#dataset'>" in shown
    assert runpage.near_duplicates_warning({"near_duplicates_warning": ""}) == ""
    assert runpage.near_duplicates_warning({}) == ""  # a summary written before the warning existed


# ---------------------------------------------------------------------------------------------- in a browser


@pytest.mark.slow
def test_run_page_shows_every_section(browser, local_runs, tmp_path):
    summary = local_runs.first
    page_path = local_runs.base / "first" / "index.html"
    assert summary["page"] == str(page_path)
    page = page_path.read_text()
    assert not re.search(r"""(src|href)=['"]?(https?:)?//""", page)  # nothing fetched: no server, no network
    seen = probe(browser, page, str(tmp_path), script=PROBE, height=3000)
    assert seen["errors"] == []
    assert seen["headings"] == SECTIONS
    assert seen["decision"] == summary["decision"]
    assert [(f["title"], f["page"]) for f in seen["frames"]] == [
        ("Evaluation report", "Evaluation report"), ("Dataset card", "Dataset card"),
        ("Augmentation preview", "Augmentation policy")]
    for frame in seen["frames"]:
        assert frame["images"] >= 1 and frame["decoded"] and frame["height"] >= 200, frame
    assert seen["figures"] == seen["gridDecoded"] == 100
    names = {row["class_name"] for row in map(json.loads, open(summary["predictions"]["path"]))}
    captions = [caption.split("\n") for caption in seen["captions"]]  # class, then confidence
    assert all(len(c) == 2 and c[0] in names and re.fullmatch(r"\d+\.\d%", c[1]) for c in captions), captions
    assert seen["curvesWidth"] > 300
    assert seen["tensorboard"].endswith(f"--logdir {summary['artifacts']['train']['tensorboard']}")
    assert seen["pageWidth"] <= seen["viewportWidth"]


@pytest.mark.slow
def test_run_page_screenshot_is_not_blank(browser, local_runs, tmp_path):
    from PIL import Image

    png = str(tmp_path / "page.png")
    screenshot(browser, str(local_runs.base / "first" / "index.html"), png, width=1280, height=2400)
    pixels = np.asarray(Image.open(png).convert("RGB")).astype(int)
    assert pixels.shape == (2400, 1280, 3)

    def share(rgb: tuple[int, int, int], tolerance: int = 6) -> float:
        return float(np.mean(np.all(np.abs(pixels - rgb) <= tolerance, axis=-1)))

    assert share((255, 255, 255)) < 0.9  # something is drawn
    assert share((230, 244, 234), 3) > 0.003  # the green decision banner (the first run is blessed)
    assert share((0, 0, 0), 8) > 0.02  # the predicted images' black backgrounds
    assert share((31, 119, 180), 16) > 0.0002  # the training curves' blue line


# ---------------------------------------------------------------------------------------------- README


def main(argv: list[str] | None = None) -> int:
    """Writes the screenshot of RUN_DIR/index.html (for the README)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("run_dir")
    parser.add_argument("png")
    parser.add_argument("--height", type=int, default=1700, help="pixels of the page to keep")
    args = parser.parse_args(argv)
    written = readme_screenshot(lambda work: os.path.join(args.run_dir, runpage.PAGE), args.png, args.height)
    if written == 0:
        print(args.png)
    return written


if __name__ == "__main__":
    raise SystemExit(main())
