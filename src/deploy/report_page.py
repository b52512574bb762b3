"""eval.py's report page, ``report.html``: one self-contained HTML file (inline CSS and
JavaScript, images embedded as base64 thumbnails; no network) of an ``eval_result.json``.

Sections: the headline numbers, the run's other values, the per-class table (sorted by a click
on a column), the confusion matrix (its top confusions past ``FULL_PLOT_CLASSES`` classes), the
first misclassified images with their top-3 and Grad-CAM overlay (an entry's ``cam``, a path
relative to the output folder), the eval and training configs, the training curves of the
checkpoint's ``metrics.jsonl``. All text is escaped. See docs/deployment.md#report-page.
A single-label result with a calibration (``eval.py --calibrate temperature``, or a model that
records a temperature) has its table before and after and the reliability diagram.
A multi-label result (``task`` multilabel: ``MultiLabelReport.summary()``) has mAP in the
headline, per-class AP, the precision-recall picture and the images of largest error instead
(docs/multilabel.md#report-page).
"""
import base64
import html
import io
import os
from collections.abc import Sequence

import numpy as np

from src.data.transforms import decode_rgb
from src.deploy.calibration_report import SCORE_KEYS, SCORE_NAMES
from src.deploy.report import FULL_PLOT_CLASSES, TOP_CONFUSIONS, top_confusions
from src.utils.curves import MetricsError, plot_runs, read_metrics
from src.utils.tasks import DEFAULT_TASK, MULTICLASS, MULTILABEL

SHOWN_IMAGES = 48  # misclassified images shown, most confident first
THUMBNAIL_SIDE = 128  # px, longest side of an embedded image (JPEG)
METRICS_FILE, TRAIN_CONFIG_FILE = "metrics.jsonl", "config.yaml"  # beside the checkpoint
HEADLINE = (("top1", "top-1"), ("top5", "top-5"), ("loss", "loss"), ("images", "images"))
REPORT_KEYS = ("per_class", "confusion_matrix", "misclassified",  # sections of their own
               "largest_errors", "ood", "calibration", "reliability")
CLASS_COLUMNS = (("class", "number"), ("name", "text"), ("images", "number"),
                 ("accuracy", "number"), ("precision", "number"), ("recall", "number"),
                 ("f1", "number"))
MULTILABEL_HEADLINE = (("mAP", "mAP"), ("exact_match", "exact match"), ("macro_f1", "macro F1"),
                       ("micro_f1", "micro F1"), ("loss", "loss"), ("images", "images"))
MULTILABEL_COLUMNS = (("class", "number"), ("name", "text"), ("positives", "number"),
                      ("ap", "number"), ("precision", "number"), ("recall", "number"),
                      ("f1", "number"), ("threshold", "number"))

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em auto;max-width:1200px;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ccc;margin-top:1.6em}
.headline{display:flex;gap:1em;flex-wrap:wrap}
.headline div{border:1px solid #ccc;border-radius:6px;padding:.4em .9em;text-align:center}
.headline b{display:block;font-size:1.6em}
table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:2px 6px;text-align:right}
td.text,th.text{text-align:left}
table.sortable th{cursor:pointer;background:#f3f3f3;user-select:none;position:sticky;top:0}
th[aria-sort=ascending]::after{content:" \\25B2"}th[aria-sort=descending]::after{content:" \\25BC"}
table.confusion td{min-width:1.8em;text-align:center}
.cards{display:flex;flex-wrap:wrap;gap:.6em}
.card{border:1px solid #ccc;border-radius:6px;padding:.4em;width:280px;font-size:12px}
.card img{width:128px;height:128px;object-fit:contain;image-rendering:pixelated;background:#eee}
.card ol{margin:.2em 0;padding-left:1.4em}.wrong{color:#a40}.path{color:#666;word-break:break-all}
.scroll{max-height:36em;overflow:auto;display:inline-block}nav{margin:.8em 0}
.note{color:#a40}pre{background:#f6f6f6;padding:.6em;overflow:auto;max-height:30em}
"""

# window.onerror is set before any other script: an error anywhere shows in data-errors
ERROR_COUNTER = """
window.onerror = function () {
  var root = document.documentElement;
  root.dataset.errors = String(Number(root.dataset.errors || 0) + 1);
};
"""

# sorting the tables of class "sortable" by a click on a column (again: the other way), and the
# images' state once the page has loaded (data-images, data-images-loaded, data-ready on body)
SCRIPT = """
(function () {
  function key(row, column, numeric) {
    var cell = row.cells[column];
    var value = cell.hasAttribute('data-value') ? cell.getAttribute('data-value')
                                                : cell.textContent;
    if (!numeric) { return value.toLowerCase(); }
    var parsed = parseFloat(value);
    return isNaN(parsed) ? -Infinity : parsed;
  }
  document.querySelectorAll('table.sortable').forEach(function (table) {
    var heads = table.tHead.rows[0].cells;
    Array.prototype.forEach.call(heads, function (th, column) {
      th.addEventListener('click', function () {
        var numeric = th.dataset.type === 'number';
        var ascending = th.getAttribute('aria-sort') !== 'ascending';
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = key(a, column, numeric), y = key(b, column, numeric);
          var order = x < y ? -1 : (x > y ? 1 : 0);
          return ascending ? order : -order;
        });
        rows.forEach(function (row) { body.appendChild(row); });
        Array.prototype.forEach.call(heads, function (h) { h.removeAttribute('aria-sort'); });
        th.setAttribute('aria-sort', ascending ? 'ascending' : 'descending');
      });
    });
  });
  window.addEventListener('load', function () {
    var loaded = 0;
    Array.prototype.forEach.call(document.images, function (img) {
      if (img.complete && img.naturalWidth > 0) { loaded += 1; }
    });
    document.body.dataset.images = String(document.images.length);
    document.body.dataset.imagesLoaded = String(loaded);
    document.body.dataset.ready = '1';
  });
})();
"""


def esc(value: object) -> str:
    """``value`` as HTML text (``&<>"'`` escaped)."""
    return html.escape(str(value), quote=True)


def number(value: object) -> str:
    """A float with 4 decimals, None as ``n/a``, anything else as is (escaped)."""
    if value is None:
        return "n/a"
    return f"{value:.4f}" if isinstance(value, float) else esc(value)


def thumbnail(path: str, exif_transpose: bool = False, side: int = THUMBNAIL_SIDE) -> str:
    """The image at ``path``, decoded as eval reads it (``decode_rgb``), as a ``data:`` URI of
    a JPEG at most ``side`` px a side.

    Raises:
        OSError: If it cannot be read. ValueError: If it cannot be decoded.
    """
    with open(path, "rb") as f:
        image = decode_rgb(f.read(), exif_transpose)
    image.thumbnail((side, side))
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def image_tag(path: str, alt: str, exif_transpose: bool = False) -> str:
    """An ``<img>`` of the embedded thumbnail of ``path``, or a note naming why it is missing."""
    try:
        return (f'<img src="{thumbnail(path, exif_transpose)}" alt="{esc(alt)}" '
                f'title="{esc(path)}">')
    except (OSError, ValueError) as err:
        return f'<p class="note">{esc(alt)} not shown: {esc(path)}: {esc(err)}</p>'


def headline(result: dict, items: Sequence[tuple[str, str]] = HEADLINE) -> str:
    return '<div class="headline">' + "".join(
        f"<div>{esc(label)}<b>{number(result[key])}</b></div>"
        for key, label in items if key in result) + "</div>"


def run_table(result: dict, items: Sequence[tuple[str, str]] = HEADLINE) -> str:
    """The result's values other than the headline's and the report's sections."""
    shown = {key for key, _ in items} | set(REPORT_KEYS)
    return '<table id="run">' + "".join(
        f'<tr><th class="text">{esc(key)}</th><td class="text">{esc(value)}</td></tr>'
        for key, value in result.items() if key not in shown) + "</table>"


def class_table(per_class: Sequence[dict],
                columns: Sequence[tuple[str, str]] = CLASS_COLUMNS) -> str:
    """The per-class table, one row per class, sortable; a None is ``n/a`` (sorted first)."""
    heads = "".join(f'<th class="{kind}" data-type="{kind}">{esc(name)}</th>'
                    for name, kind in columns)
    rows = []
    for entry in per_class:
        cells = "".join(f'<td class="{kind}" data-value="{esc(value_of(entry[name]))}">'
                        f"{number(entry[name])}</td>" for name, kind in columns)
        rows.append(f"<tr>{cells}</tr>")
    return (f'<table id="per-class" class="sortable"><thead><tr>{heads}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def value_of(value: object) -> object:
    """A table cell's sort value: None is empty."""
    return "" if value is None else value


def confusion_section(matrix: Sequence[Sequence[int]], names: Sequence[str]) -> str:
    """The matrix as a table (row = true class, column = predicted, shaded by the row's share)
    up to ``FULL_PLOT_CLASSES`` classes; past that its ``TOP_CONFUSIONS`` largest cells."""
    counts = np.array(matrix, np.int64)
    if len(names) > FULL_PLOT_CLASSES:
        items = "".join(f"<li>{esc(line)}</li>" for line in top_confusions(
            counts, names, top=TOP_CONFUSIONS))
        return (f"<p>{len(names)} classes: the {TOP_CONFUSIONS} most frequent confusions "
                f'(true -> predicted: images)</p><ol id="top-confusions">{items}</ol>')
    rows = counts.sum(axis=1, keepdims=True)
    share = np.divide(counts, rows, out=np.zeros(counts.shape), where=rows > 0)
    heads = "".join(f'<th title="{esc(name)}">{k}</th>' for k, name in enumerate(names))
    body = []
    for t, name in enumerate(names):
        cells = "".join(f'<td style="background:rgba(31,119,180,{share[t, p]:.2f})'
                        f'{";color:#fff" if share[t, p] > 0.5 else ""}">{counts[t, p] or ""}</td>'
                        for p in range(len(names)))
        body.append(f'<tr><th class="text">{t} {esc(name)}</th>{cells}</tr>')
    return ('<p>rows: true class; columns: predicted class (hover for its name)</p>'
            f'<table id="confusion" class="confusion"><thead><tr><th></th>{heads}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>')


def picture_and_place(image: str | int, exif_transpose: bool) -> tuple[str, str]:
    """A card's image (a file path: its thumbnail; an index, as in the CIFAR-10 binary
    format: none) and the line naming it."""
    if isinstance(image, str):
        return image_tag(image, "image", exif_transpose), f'<div class="path">{esc(image)}</div>'
    return "", f"<div>image {esc(image)} in evaluation order</div>"


def mistake_card(entry: dict, output_dir: str, exif_transpose: bool) -> str:
    """One misclassified image: the image, its CAM overlay when ``cam`` is set, the true and
    predicted classes, the top-3."""
    picture, where = picture_and_place(entry["image"], exif_transpose)
    if entry.get("cam"):
        picture += image_tag(os.path.join(output_dir, entry["cam"]), "Grad-CAM")
    top = "".join(f'<li>{esc(t["name"])} {t["probability"]:.3f}</li>'
                  for t in entry.get("top3", []))
    return (f'<div class="card">{picture}<div>true <b>{esc(entry["true_name"])}</b>, '
            f'predicted <b>{esc(entry["predicted_name"])}</b> '
            f'({entry["probability"]:.3f})</div><ol class="top3">{top}</ol>{where}</div>')


def mistakes_section(mistakes: Sequence[dict], output_dir: str, shown: int,
                     exif_transpose: bool) -> str:
    cards = "".join(mistake_card(entry, output_dir, exif_transpose) for entry in mistakes[:shown])
    if not mistakes:
        return "<p>no misclassified images</p>"
    return (f"<p>{len(mistakes)} misclassified images; the first {min(shown, len(mistakes))}, "
            f'most confident first, with the top-3 classes</p><div class="cards">{cards}</div>')


def error_card(entry: dict, exif_transpose: bool) -> str:
    """One image of large multi-label error: the image, its true and predicted labels, the
    false positives and negatives with their probabilities."""
    picture, where = picture_and_place(entry["image"], exif_transpose)
    probability = entry.get("probabilities", {})

    def labels(names):
        return ", ".join(f"{esc(n)} {probability[n]:.3f}" if n in probability else esc(n)
                         for n in names) or "none"
    return (f'<div class="card">{picture}<div>true: <b>{labels(entry["true"])}</b></div>'
            f'<div>predicted: <b>{labels(entry["predicted"])}</b></div>'
            f'<div class="wrong">false positives: {labels(entry["false_positives"])}; '
            f'false negatives: {labels(entry["false_negatives"])}</div>'
            f'<div>largest error {entry["max_error"]:.3f}</div>{where}</div>')


def errors_section(errors: Sequence[dict], shown: int, exif_transpose: bool) -> str:
    if not errors:
        return "<p>no images</p>"
    cards = "".join(error_card(entry, exif_transpose) for entry in errors[:shown])
    return (f"<p>the {min(shown, len(errors))} images of largest error (the largest "
            f"|probability - target| over their classes) first</p>"
            f'<div class="cards">{cards}</div>')


def png_tag(data: bytes, element_id: str, alt: str) -> str:
    """An ``<img>`` of the PNG bytes ``data``, embedded, as wide as the page at most."""
    encoded = base64.b64encode(data).decode("ascii")
    return (f'<img id="{element_id}" alt="{esc(alt)}" src="data:image/png;base64,{encoded}" '
            f'style="max-width:100%">')


def pr_curves_section(path: str | None) -> str:
    """The precision-recall picture at ``path`` embedded, or a note naming why it is not."""
    if path is None:
        return ('<p class="note">no precision-recall picture (eval.py draws it with plot '
                "true)</p>")
    try:
        with open(path, "rb") as f:
            return png_tag(f.read(), "pr-curves", "precision-recall curves per class")
    except OSError as err:
        return f'<p class="note">precision-recall picture not shown: {esc(path)}: {esc(err)}</p>'


def curves_section(metrics_path: str) -> str:
    """The training curves of ``metrics_path`` as an embedded PNG, or a note naming why not."""
    try:
        records = read_metrics(metrics_path)
        label = os.path.basename(os.path.dirname(os.path.abspath(metrics_path)))
        buffer = plot_runs([(label, records)], io.BytesIO())
    except MetricsError as err:
        return f'<p class="note">training curves not drawn: {esc(err)}</p>'
    except ImportError:
        return ('<p class="note">training curves not drawn: matplotlib is not installed '
                "(requirements-dev.txt)</p>")
    return f'<p>{esc(metrics_path)}</p>' + png_tag(buffer.getvalue(), "curves", "training curves")


def run_folder_of(checkpoint_path: str) -> str | None:
    """The folder of a checkpoint file (where train.py wrote its metrics and config), or None
    for anything else (Hub ids, folders)."""
    return (os.path.dirname(checkpoint_path) or ".") if os.path.isfile(checkpoint_path) else None


def class_section(per_class: Sequence[dict], columns: Sequence[tuple[str, str]]) -> tuple:
    return ("per-class-results", f"Per-class results ({len(per_class)} classes; click a "
            "column to sort)", f'<div class="scroll">{class_table(per_class, columns)}</div>')


def ood_section(ood: dict, output_dir: str) -> tuple[str, str, str]:
    """eval.py's out-of-distribution result (``ood_summary``): AUROC, FPR at 95% TPR and AUPR
    of each score, what the threshold keeps, the histogram (``histogram``, relative to
    ``output_dir``) embedded."""
    rows = "".join(f'<tr><td class="text">{esc(name)}</td><td>{number(v["auroc"])}</td>'
                   f'<td>{number(v["fpr_at_95_tpr"])}</td><td>{number(v["aupr"])}</td></tr>'
                   for name, v in ood.get("scores", {}).items())
    body = (f'<p>{ood["images"]} unknown images ({esc(ood.get("data_path"))}) against the '
            f'{ood["in_distribution_images"]} images evaluated (positive)</p>' if "images" in ood
            else "<p>no unknown images given (eval.py --ood_data_path)</p>")
    if rows:
        body += ('<table id="ood-scores"><thead><tr><th class="text">score</th><th>AUROC</th>'
                 f'<th>FPR at 95% TPR</th><th>AUPR</th></tr></thead><tbody>{rows}</tbody>'
                 '</table>')
    if "threshold" in ood:
        t = ood["threshold"]
        body += (f'<p id="ood-threshold">threshold: {esc(t["score"])} {t["value"]:.6g} keeps '
                 f'{t["tpr"]:.4f} of the images evaluated'
                 + (f' and {t["fpr"]:.4f} of the unknown ones' if "fpr" in t else "") + "</p>")
    if ood.get("histogram"):
        path = os.path.join(output_dir, ood["histogram"])
        try:
            with open(path, "rb") as f:
                body += png_tag(f.read(), "ood-histogram", "histograms of the OOD scores")
        except OSError as err:
            body += f'<p class="note">histogram not shown: {esc(path)}: {esc(err)}</p>'
    return "out-of-distribution", "Out-of-distribution scores", body


def calibration_section(calibration: dict, output_dir: str) -> str:
    """A calibration summary (``src.deploy.calibration_report.calibration_result``): its
    measures before (T = 1) and after the temperature as a table, and its reliability
    diagram (``reliability_diagram``, relative to ``output_dir``) embedded, or a note."""
    how = "fitted on these images" if calibration["fitted_here"] else "the model's recorded one"
    rows = "".join(f'<tr><th class="text">{esc(SCORE_NAMES[k])}</th>'
                   f'<td>{number(calibration["before"][k])}</td>'
                   f'<td>{number(calibration["after"][k])}</td></tr>' for k in SCORE_KEYS)
    table = (f'<p>temperature {calibration["temperature"]:.4f} ({esc(how)}), '
             f'{calibration["images"]} images, {calibration["bins"]} bins</p>'
             f'<table id="calibration"><thead><tr><th></th><th>T = 1</th>'
             f'<th>T = {calibration["temperature"]:.4f}</th></tr></thead>'
             f"<tbody>{rows}</tbody></table>")
    picture = calibration.get("reliability_diagram")
    if picture is None:
        return table + '<p class="note">no reliability diagram (matplotlib not installed)</p>'
    try:
        with open(os.path.join(output_dir, picture), "rb") as f:
            return table + png_tag(f.read(), "reliability-diagram", "reliability diagram")
    except OSError as err:
        return table + (f'<p class="note">reliability diagram not shown: {esc(picture)}: '
                        f"{esc(err)}</p>")


def multiclass_sections(result: dict, *, output_dir: str, shown: int, exif_transpose: bool,
                        pr_curves: str | None) -> list[tuple[str, str, str]]:
    """The sections of a multi-class result: per class, calibration (when the result has
    one), confusion matrix, misclassified, and the out-of-distribution scores when evaluated."""
    names = [c["name"] for c in result["per_class"]]
    calibration = ([("calibration-section", "Calibration",
                     calibration_section(result["calibration"], output_dir))]
                   if "calibration" in result else [])
    return [class_section(result["per_class"], CLASS_COLUMNS), *calibration,
            ("confusion-matrix", "Confusion matrix",
             confusion_section(result["confusion_matrix"], names)),
            ("misclassified-images", "Misclassified images",
             mistakes_section(result["misclassified"], output_dir, shown, exif_transpose))] + (
        [ood_section(result["ood"], output_dir)] if "ood" in result else [])


def multilabel_sections(result: dict, *, output_dir: str, shown: int, exif_transpose: bool,
                        pr_curves: str | None) -> list[tuple[str, str, str]]:
    """The sections of a multi-label result: per class, PR curves, largest errors."""
    return [class_section(result["per_class"], MULTILABEL_COLUMNS),
            ("precision-recall-curves", "Precision-recall curves", pr_curves_section(pr_curves)),
            ("largest-errors", "Images of largest error",
             errors_section(result["largest_errors"], shown, exif_transpose))]


PAGE_KINDS = {MULTICLASS.name: (HEADLINE, multiclass_sections),  # result["task"] -> its page
              MULTILABEL.name: (MULTILABEL_HEADLINE, multilabel_sections)}


def build_report_page(result: dict, *, output_dir: str, eval_config: str,
                      run_folder: str | None = None, shown: int = SHOWN_IMAGES,
                      exif_transpose: bool = False, pr_curves: str | None = None) -> str:
    """The report page of an evaluation.

    Args:
        result: ``eval_result.json``'s content (eval.py: the summary and
            ``ClassReport.summary()``; with ``task`` multilabel,
            ``MultiLabelReport.summary()``).
        output_dir: The page's folder; ``cam`` paths are relative to it.
        eval_config: The eval run's config (YAML text).
        run_folder: Where ``metrics.jsonl`` and the training ``config.yaml`` are looked for
            (``run_folder_of``); None: no training sections.
        shown: How many misclassified (multi-label: largest-error) images are shown.
        exif_transpose: Their thumbnails turned upright first, as eval read them.
        pr_curves: Multi-label: the PNG of ``MultiLabelReport.plot_pr_curves``, embedded.

    Returns:
        The HTML document.

    Raises:
        ValueError: If ``result["task"]`` is not a key of ``PAGE_KINDS``.
    """
    task = result.get("task", DEFAULT_TASK.name)
    if task not in PAGE_KINDS:
        raise ValueError(f"task {task!r}: the report page knows {', '.join(PAGE_KINDS)}")
    items, task_sections = PAGE_KINDS[task]
    title = f"Evaluation report: {result.get('net_name', '')} on {result.get('data_path', '')}"
    metrics = train_config = None
    if run_folder:
        metrics, train_config = (os.path.join(run_folder, name) for name in (
            METRICS_FILE, TRAIN_CONFIG_FILE))
    # (anchor, heading, content) of each section; the headline above them
    sections = [("run", "Run", run_table(result, items))] + task_sections(
        result, output_dir=output_dir, shown=shown, exif_transpose=exif_transpose,
        pr_curves=pr_curves)
    if metrics and os.path.isfile(metrics):
        sections.insert(1, ("training-curves", "Training curves", curves_section(metrics)))
    sections.append(("eval-config-section", "Eval config",
                     f'<pre id="eval-config">{esc(eval_config)}</pre>'))
    if train_config and os.path.isfile(train_config):
        with open(train_config, encoding="utf-8", errors="replace") as f:
            sections.append(("training-config", "Training config", f"<p>{esc(train_config)}</p>"
                             f'<pre id="train-config">{esc(f.read())}</pre>'))
    nav = " | ".join(f'<a href="#{anchor}">{esc(heading.split(" (")[0])}</a>'
                     for anchor, heading, _ in sections)
    parts = [f"<h1>{esc(title)}</h1>", headline(result, items), f"<nav>{nav}</nav>"] + [
        f'<h2 id="{anchor}">{esc(heading)}</h2>\n{body}' for anchor, heading, body in sections]
    return (f'<!DOCTYPE html>\n<html lang="en" data-errors="0"><head><meta charset="utf-8">'
            f"<title>{esc(title)}</title><style>{STYLE}</style>"
            f"<script>{ERROR_COUNTER}</script></head>\n<body>\n" + "\n".join(parts)
            + f"\n<script>{SCRIPT}</script>\n</body></html>\n")
