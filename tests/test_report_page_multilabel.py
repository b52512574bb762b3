"""The multi-label report page (``src/deploy/report_page.py`` with ``task`` multilabel): the
builder on a made-up result (mAP headline, per-class AP with ``n/a``, the precision-recall
picture embedded, the images of largest error), and the page in headless Chromium (images
loaded, no console message, sorting by AP with ``n/a`` first)."""
import base64
import glob
import os

import numpy as np
import pytest

from src.deploy.multilabel_report import MultiLabelReport
from src.deploy.report_page import build_report_page
from tests.helpers import CIFAR_SAMPLE
from tests.test_report_page import (
    body_rows,
    chromium,
    data_uri_image,
    parse,
    require_chromium,
)

NAMES = ["airplane", '<b id="x">cat</b>', "ship", "truck"]


def made_up_result(tmp_path, count=12, seed=0, picture=True):
    """eval_result.json's content of a multi-label evaluation of ``count`` shipped CIFAR-10
    test images with random labels (class 3 without any positive) and scores; ``picture``:
    its PR curves written to ``tmp_path``."""
    files = sorted(glob.glob(os.path.join(CIFAR_SAMPLE, "test", "*", "*.jpg")))[:count]
    rng = np.random.default_rng(seed)
    targets = rng.random((count, len(NAMES))) < 0.4
    targets[:, 3] = False
    report = MultiLabelReport(NAMES, files, thresholds=[0.5, 0.4, 0.5, 0.5])
    report.update(np.clip(rng.random(targets.shape) * 0.7 + 0.3 * targets, 0, 1), targets)
    if picture:
        report.plot_pr_curves(str(tmp_path / "pr_curves.png"))
    return {"task": "multilabel", "net_name": "resnet18", "data_path": "mosaics",
            "images": count, "loss": 0.25, **report.summary()}


def test_the_multilabel_page_shows_ap_the_curves_and_the_largest_errors(tmp_path):
    result = made_up_result(tmp_path)
    page = build_report_page(result, output_dir=str(tmp_path), eval_config="",
                             pr_curves=str(tmp_path / "pr_curves.png"), shown=5)
    assert NAMES[1] not in page
    root = parse(page)
    headline = [div.content() for div in root.one("div", **{"class": "headline"}).all("div")]
    assert headline == [f"mAP{result['mAP']:.4f}", f"exact match{result['exact_match']:.4f}",
                        f"macro F1{result['macro_f1']:.4f}", f"micro F1{result['micro_f1']:.4f}",
                        "loss0.2500", "images12"]
    rows = body_rows(root.one("table", id="per-class"))
    columns = ("class", "name", "positives", "ap", "precision", "recall", "f1", "threshold")
    assert [[cell.attrs["data-value"] for cell in row.all("td")] for row in rows] == [
        ["" if c[key] is None else str(c[key]) for key in columns] for c in result["per_class"]]
    assert [row.children[3].content() for row in rows][3] == "n/a"
    assert rows[1].children[1].content() == NAMES[1] and not list(root.all("b", id="x"))
    embedded = root.one("img", id="pr-curves").attrs["src"]
    assert data_uri_image(embedded).format == "PNG"
    assert base64.b64decode(embedded.split(",", 1)[1]) == (tmp_path / "pr_curves.png").read_bytes()
    cards = list(root.all("div", **{"class": "card"}))
    assert len(cards) == 5 < len(result["largest_errors"])
    first = result["largest_errors"][0]
    text = cards[0].content()
    assert f"largest error {first['max_error']:.3f}" in text and first["image"] in text
    for name in first["false_positives"] + first["false_negatives"]:
        assert f"{name} {first['probabilities'][name]:.3f}" in cards[0].one(
            "div", **{"class": "wrong"}).content()
    assert [len(list(card.all("img"))) for card in cards] == [1] * 5
    assert not list(root.all(id="confusion")) and not list(root.all(id="misclassified-images"))


def test_without_the_picture_the_page_says_so_and_an_unknown_task_is_refused(tmp_path):
    result = made_up_result(tmp_path, count=4, picture=False)
    root = parse(build_report_page(result, output_dir=str(tmp_path), eval_config=""))
    assert not list(root.all("img", id="pr-curves"))
    assert "no precision-recall picture" in root.one("p", **{"class": "note"}).content()
    with pytest.raises(ValueError, match="task 'detection': the report page knows multiclass"):
        build_report_page(dict(result, task="detection"), output_dir=str(tmp_path),
                          eval_config="")


@pytest.mark.parametrize("where", ["missing", "a folder"])
def test_a_picture_that_cannot_be_read_is_a_note(tmp_path, where):
    """The PR picture's path given but not readable (gone, or a folder: root reads any
    file, so no mode bits): the page is built, the picture replaced by a note naming the
    path and the system's reason."""
    result = made_up_result(tmp_path, count=4, picture=False)
    path = tmp_path / "pr_curves.png"
    if where == "a folder":
        path.mkdir()
    page = build_report_page(result, output_dir=str(tmp_path), eval_config="",
                             pr_curves=str(path))
    root = parse(page)
    assert not list(root.all("img", id="pr-curves"))
    reason = "No such file or directory" if where == "missing" else "Is a directory"
    notes = [p.content() for p in root.all("p", **{"class": "note"})]
    assert [n for n in notes if n.startswith("precision-recall picture not shown: ")] == [
        f"precision-recall picture not shown: {path}: [Errno {2 if where == 'missing' else 21}"
        f"] {reason}: '{path}'"], notes


# clicks the AP header twice and records the order of the AP column after each click
AP_CLICKS = """<script>
window.addEventListener('load', function () {
  var table = document.getElementById('per-class');
  var heads = Array.prototype.slice.call(table.tHead.rows[0].cells);
  var ap = heads.findIndex(function (th) { return th.textContent === 'ap'; });
  function order() {
    return Array.prototype.map.call(table.tBodies[0].rows, function (row) {
      return row.cells[ap].textContent; }).join('|');
  }
  heads[ap].click(); document.body.dataset.apUp = order();
  heads[ap].click(); document.body.dataset.apDown = order();
});
</script>"""


def test_the_multilabel_page_renders_and_sorts_in_chromium(tmp_path):
    require_chromium()
    result = made_up_result(tmp_path)
    page = tmp_path / "report.html"
    page.write_text(build_report_page(
        result, output_dir=str(tmp_path), eval_config="", pr_curves=str(tmp_path / "pr_curves.png"),
        shown=5).replace("</body>", AP_CLICKS + "</body>"))
    dom, console = chromium(page, tmp_path / "profile", "--dump-dom")
    assert console == []
    root = parse(dom)
    body = root.one("body")
    assert root.one("html").attrs["data-errors"] == "0" and body.attrs["data-ready"] == "1"
    assert body.attrs["data-images"] == body.attrs["data-images-loaded"] == "6"  # 5 + curves
    ap = [f"{c['ap']:.4f}" if c["ap"] is not None else "n/a" for c in result["per_class"]]
    known = sorted(a for a in ap if a != "n/a")
    assert body.attrs["data-ap-up"].split("|") == ["n/a"] + known
    assert body.attrs["data-ap-down"].split("|") == known[::-1] + ["n/a"]
