"""eval.py's report page (``src/deploy/report_page.py``): the builder on made-up results (text
escaped, one row per class, the matrix or its top confusions, CAM overlays, training curves
and config only when beside the checkpoint), and the page of a real eval run rendered in
headless Chromium (rows, images loaded, no console errors, sorting by a click, a screenshot)."""
import base64
import glob
import io
import json
import os
import shutil
import subprocess
from html.parser import HTMLParser

import numpy as np
import pytest
from PIL import Image

from src.deploy.report import ClassReport, top_confusions
from src.deploy.report_page import SHOWN_IMAGES, THUMBNAIL_SIDE, build_report_page
from src.utils.curves import DPI, FIGSIZE
from tests.helpers import CIFAR_SAMPLE, ROOT, run_in_process, succeeded

VOID = {"img", "meta", "br", "hr", "input", "link", "source", "wbr"}


class Node:
    def __init__(self, tag, attrs):
        self.tag, self.attrs, self.children, self.text = tag, dict(attrs), [], ""

    def all(self, tag=None, **attrs):
        """Descendants (depth first) of ``tag`` whose attributes include ``attrs``."""
        for child in self.children:
            if (tag is None or child.tag == tag) and all(
                    child.attrs.get(k.replace("_", "-")) == v for k, v in attrs.items()):
                yield child
            yield from child.all(tag, **attrs)

    def one(self, tag=None, **attrs):
        found = list(self.all(tag, **attrs))
        assert len(found) == 1, f"{len(found)} <{tag} {attrs}>"
        return found[0]

    def content(self):
        return self.text + "".join(child.content() for child in self.children)


class Tree(HTMLParser):
    """The element tree of an HTML document (enough of it for these pages)."""

    def __init__(self, text):
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", [])
        self.stack = [self.root]
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        node = Node(tag, attrs)
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_endtag(self, tag):
        while len(self.stack) > 1 and self.stack.pop().tag != tag:
            pass

    def handle_data(self, data):
        node = Node("#text", [])
        node.text = data
        self.stack[-1].children.append(node)


def parse(text):
    return Tree(text).root


def body_rows(table):
    return list(table.one("tbody").all("tr"))


def data_uri_image(src):
    """The Pillow image of a ``data:image/...;base64,`` URI."""
    assert src.startswith("data:image/"), src[:40]
    return Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1])))


def sample_images(per_class):
    """(path, label) of the first ``per_class`` shipped CIFAR-10 test images of each class,
    and the class names."""
    names = sorted(os.listdir(os.path.join(CIFAR_SAMPLE, "test")))
    files = [(path, label) for label, name in enumerate(names) for path in sorted(
        glob.glob(os.path.join(CIFAR_SAMPLE, "test", name, "*")))[:per_class]]
    return files, names


def made_up_result(names, files=None, count=None, seed=0):
    """eval_result.json's content for random logits over ``files`` (or ``count`` images named
    by index)."""
    labels = np.array([label for _, label in files] if files else np.arange(count) % len(names))
    report = ClassReport(len(names), names, files)
    report.update(np.random.default_rng(seed).normal(size=(len(labels), len(names))), labels)
    return {"net_name": "resnet18", "data_path": "somewhere", "checkpoint_path": "m.ckpt",
            "images": len(labels), "top1": 0.1, "top5": 0.5, "loss": 2.3, **report.summary()}


def test_top3_of_each_misclassified_image_are_its_three_most_probable_classes():
    logits = np.array([[0.0, 3.0, 1.0, 2.0], [5.0, 0.0, 0.0, 0.0]])
    report = ClassReport(4, ["a", "b", "c", "d"])
    report.update(logits, np.array([0, 0]))  # image 0 is wrong (b), image 1 right
    (entry,) = report.summary()["misclassified"]
    softmax = np.exp(logits[0]) / np.exp(logits[0]).sum()
    assert [(t["class"], t["name"]) for t in entry["top3"]] == [(1, "b"), (3, "d"), (2, "c")]
    assert [t["probability"] for t in entry["top3"]] == [round(float(softmax[k]), 6)
                                                         for k in (1, 3, 2)]
    assert entry["top3"][0]["probability"] == entry["probability"]


def test_class_names_paths_and_config_are_escaped(tmp_path):
    hostile = '<b id="x">cat</b> & "dog\'s"'
    folder = tmp_path / "<img src=x onerror=alert(1)>"
    folder.mkdir()
    image = folder / "a.jpg"
    Image.new("RGB", (8, 8), (200, 10, 10)).save(image)
    result = made_up_result([hostile, "plain"], files=[(str(image), 0), (str(image), 1)])
    result["data_path"] = str(folder)
    page = build_report_page(result, output_dir=str(tmp_path), eval_config="k: </pre><i>")
    assert hostile not in page and "<img src=x" not in page and "</pre><i>" not in page
    root = parse(page)
    assert root.one("title").content() == f"Evaluation report: resnet18 on {folder}"
    names = [row.children[1].content() for row in body_rows(root.one("table", id="per-class"))]
    assert names == [hostile, "plain"]  # the text itself, not markup
    assert root.one("pre", id="eval-config").content() == "k: </pre><i>"
    assert not list(root.all("b", id="x")) and not list(root.all("i"))


def test_one_row_per_class_and_the_matrix_as_a_table_up_to_fifty_classes(tmp_path):
    files, names = sample_images(2)
    result = made_up_result(names, files=files)
    root = parse(build_report_page(result, output_dir=str(tmp_path), eval_config=""))
    rows = body_rows(root.one("table", id="per-class"))
    assert len(rows) == len(names) == 10
    assert [[cell.attrs["data-value"] for cell in row.all("td")] for row in rows] == [
        [str(c[key]) for key in ("class", "name", "images", "accuracy", "precision", "recall",
                                 "f1")] for c in result["per_class"]]
    matrix = [[int(cell.content() or 0) for cell in row.all("td")]
              for row in body_rows(root.one("table", id="confusion"))]
    assert matrix == result["confusion_matrix"]
    assert not list(root.all(id="top-confusions"))


def test_past_fifty_classes_the_page_lists_the_top_confusions(tmp_path):
    names = [f"class {k}" for k in range(60)]
    result = made_up_result(names, count=600)
    root = parse(build_report_page(result, output_dir=str(tmp_path), eval_config=""))
    assert len(body_rows(root.one("table", id="per-class"))) == 60
    assert not list(root.all(id="confusion"))
    listed = [item.content() for item in root.one("ol", id="top-confusions").all("li")]
    assert listed == top_confusions(result["confusion_matrix"], names) and listed
    # images named by index (the CIFAR-10 binary format): cards without pictures
    assert not list(root.all("img"))
    assert len(list(root.all("div", **{"class": "card"}))) == min(SHOWN_IMAGES, len(
        result["misclassified"]))


def test_misclassified_images_are_embedded_with_their_cam_overlay_when_named(tmp_path):
    files, names = sample_images(1)
    result = made_up_result(names, files=files)
    os.makedirs(tmp_path / "cam")
    Image.new("RGB", (320, 160), (0, 255, 0)).save(tmp_path / "cam" / "first.png")
    result["misclassified"][0]["cam"] = os.path.join("cam", "first.png")  # relative to the page
    root = parse(build_report_page(result, output_dir=str(tmp_path), eval_config="", shown=3))
    cards = list(root.all("div", **{"class": "card"}))
    assert len(cards) == 3 < len(result["misclassified"])
    pictures = [[img.attrs for img in card.all("img")] for card in cards]
    assert [len(p) for p in pictures] == [2, 1, 1]
    for card, entry in zip(pictures, result["misclassified"]):
        with Image.open(entry["image"]) as original:  # 32 x 32: embedded as it is
            assert data_uri_image(card[0]["src"]).size == original.size
    cam = data_uri_image(pictures[0][1]["src"])
    assert cam.size == (THUMBNAIL_SIDE, THUMBNAIL_SIDE // 2)  # shrunk, aspect kept
    assert np.abs(np.asarray(cam, np.int16) - (0, 255, 0)).max() <= 8  # JPEG's rounding
    top3 = [li.content() for li in cards[0].one("ol").all("li")]
    assert top3 == [f"{t['name']} {t['probability']:.3f}" for t in
                    result["misclassified"][0]["top3"]]


def test_an_unreadable_image_is_named_on_the_page(tmp_path):
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"not a JPEG")
    result = made_up_result(["a", "b"], files=[(str(bad), 0)] * 1 + [(str(bad), 1)])
    root = parse(build_report_page(result, output_dir=str(tmp_path), eval_config=""))
    notes = [p.content() for p in root.all("p", **{"class": "note"})]
    assert notes and all(str(bad) in note for note in notes) and not list(root.all("img"))


def test_thumbnails_are_turned_upright_as_eval_read_them(tmp_path):
    """With ``exif_transpose`` (the eval config's), a photo stored sideways is shown upright."""
    from tests.test_exif import save_with_orientation

    wide = Image.new("RGB", (120, 60), (10, 200, 10))
    stored = save_with_orientation(wide, tmp_path / "sideways.jpg", 6)  # 90 degrees clockwise
    result = made_up_result(["a", "b"], files=[(stored, 0), (stored, 1)])
    sizes = {}
    for upright in (False, True):
        root = parse(build_report_page(result, output_dir=str(tmp_path), eval_config="",
                                       exif_transpose=upright))
        sizes[upright] = {data_uri_image(img.attrs["src"]).size for img in root.all("img")}
    assert sizes == {False: {(120, 60)}, True: {(60, 120)}}


def test_training_curves_and_config_only_when_beside_the_checkpoint(tmp_path):
    result = made_up_result(["a", "b"], count=4)
    run = tmp_path / "run"
    run.mkdir()
    for folder in (None, str(run)):  # no run folder; a folder without the files
        root = parse(build_report_page(result, output_dir=str(tmp_path), eval_config="",
                                       run_folder=folder))
        assert not list(root.all(id="training-curves")) and not list(root.all(id="train-config"))
    (run / "config.yaml").write_text("net_name: resnet18 # <trained>\n")
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(
        {"epoch": e, "loss": 2.0 / e, "lr": 0.1, "top1": 0.1 * e}) for e in (1, 2, 3)))
    root = parse(build_report_page(result, output_dir=str(tmp_path), eval_config="",
                                   run_folder=str(run)))
    assert root.one("pre", id="train-config").content() == "net_name: resnet18 # <trained>\n"
    root.one("h2", id="training-curves")
    curves = data_uri_image(root.one("img", id="curves").attrs["src"])
    assert curves.format == "PNG" and curves.size == (FIGSIZE[0] * DPI, round(FIGSIZE[1] * DPI))
    (run / "metrics.jsonl").write_text("{not json\n")  # a note, not a failed eval
    root = parse(build_report_page(result, output_dir=str(tmp_path), eval_config="",
                                   run_folder=str(run)))
    assert "line 1: not JSON" in root.one("p", **{"class": "note"}).content()


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run",
                  "--enable-logging=stderr", "--v=0")

# appended to a copy of the page: clicks the per-class table's headers as a user would and
# records the rows' order after each click in data attributes of <body>
SORT_CLICKS = """<script>
window.addEventListener('load', function () {
  var table = document.getElementById('per-class');
  var heads = Array.prototype.slice.call(table.tHead.rows[0].cells);
  function column(name) {
    var i = heads.findIndex(function (th) { return th.textContent === name; });
    return Array.prototype.map.call(table.tBodies[0].rows, function (row) {
      return row.cells[i].getAttribute('data-value'); }).join('|');
  }
  function click(name) { heads.find(function (th) { return th.textContent === name; }).click(); }
  click('accuracy'); document.body.dataset.accuracyUp = column('accuracy');
  click('accuracy'); document.body.dataset.accuracyDown = column('accuracy');
  click('name'); document.body.dataset.namesUp = column('name');
});
</script>"""


def require_chromium():
    """Chromium's path; skip without it, or fail when CI is set (.ci/run installs it)."""
    if CHROMIUM:
        return CHROMIUM
    reason = "no chromium on PATH (Debian: apt-get install chromium; .ci/run does)"
    if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
        pytest.fail(f"{reason}; CI is set, so a missing browser is a failure")
    pytest.skip(reason)


def chromium(page, profile, *args):
    """Chromium's headless run on the file ``page``: (stdout, the page's console lines)."""
    run = subprocess.run([require_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args,
                          "file://" + os.path.abspath(page)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout, [line for line in run.stderr.splitlines() if ":CONSOLE" in line]


@pytest.mark.slow
def test_the_page_of_a_real_eval_renders_in_chromium(quick_start, tmp_path):
    """eval.py on the quick start's checkpoint writes report.html; Chromium shows it with
    every class's row, every image decoded, no console message, and sorts on a click."""
    require_chromium()
    test = os.path.join(CIFAR_SAMPLE, "test")
    out = tmp_path / "eval"
    config = os.path.join(ROOT, "configs", "quick_start.yaml")
    succeeded(run_in_process("eval.py", "--config_path", config, "--checkpoint_path",
                             quick_start["ckpt"], "--data_path", test, "--output_dir", out,
                             cwd=tmp_path))
    result = json.load(open(out / "eval_result.json"))
    page = out / "report.html"
    dom, console = chromium(page, tmp_path / "profile", "--dump-dom")
    assert console == []  # no error, no message at all
    root = parse(dom)
    html_node, body = root.one("html"), root.one("body")
    assert html_node.attrs["data-errors"] == "0" and body.attrs["data-ready"] == "1"
    assert root.one("title").content() == f"Evaluation report: resnet18 on {test}"
    rows = body_rows(root.one("table", id="per-class"))
    assert [row.children[1].content() for row in rows] == sorted(os.listdir(test))
    shown = min(SHOWN_IMAGES, len(result["misclassified"]))
    assert shown > 0 and len(list(root.all("div", **{"class": "card"}))) == shown
    # the misclassified images and the training curves (metrics.jsonl beside the checkpoint)
    assert body.attrs["data-images"] == body.attrs["data-images-loaded"] == str(shown + 1)
    root.one("pre", id="train-config")
    screenshot = tmp_path / "report.png"
    chromium(page, tmp_path / "profile", f"--screenshot={screenshot}", "--window-size=1280,2000")
    assert Image.open(screenshot).size == (1280, 2000)

    clicked = tmp_path / "clicked.html"
    clicked.write_text(page.read_text().replace("</body>", SORT_CLICKS + "</body>"))
    dom, console = chromium(clicked, tmp_path / "profile", "--dump-dom")
    body = parse(dom).one("body")
    accuracy = sorted(c["accuracy"] for c in result["per_class"])
    assert [float(a) for a in body.attrs["data-accuracy-up"].split("|")] == accuracy
    assert [float(a) for a in body.attrs["data-accuracy-down"].split("|")] == accuracy[::-1]
    assert body.attrs["data-names-up"].split("|") == sorted(c["name"] for c in result["per_class"])
    assert console == []
