"""Likely label errors from out-of-sample probabilities: confident learning (Northcutt, Jiang and
Chuang 2021, "Confident Learning: Estimating Uncertainty in Dataset Labels", JAIR; cleanlab's
``find_label_issues``, its default ``prune_by_noise_rate`` rule) ranked by self-confidence,
and what ``label_issues.py`` writes of them: ``label_issues.csv`` and the self-contained page
``label_issues.html`` (thumbnails, the given and the suggested label on each; every text
escaped). The task decides the form (``Task.multi_hot``): one class per image (the
probability of the given label, lowest first), or a set of classes per image (cleanlab's
multi-label form: one-vs-rest per class, ranked by the multi-label label quality score of
Thyagarajan, Snorrason, Northcutt and Mueller 2023, "Identifying Incorrect Annotations in
Multi-Label Classification Data", arXiv:2211.13895). See docs/label_issues.md.
"""
import csv
import io
from collections.abc import Sequence

import numpy as np

from src.deploy.report_page import ERROR_COUNTER, SCRIPT, STYLE, esc, headline, image_tag
from src.utils.multilabel_metrics import DEFAULT_THRESHOLD, mean_average_precision
from src.utils.tasks import MULTICLASS, Task, get_task

CSV_HEADER = ("path", "given_label", "suggested_label", "score")
PAGE_STYLE = (STYLE + ".given{color:#a40}.suggested{color:#063}"
              ".removed{color:#a40;text-decoration:line-through}.added{color:#063}\n")


def _cleanlab(module: str):
    """A cleanlab module (``filter``, ``multilabel_classification.filter`` ...).

    Raises:
        ImportError: Without cleanlab (requirements.txt).
    """
    import importlib

    try:
        return importlib.import_module(f"cleanlab.{module}")
    except ImportError as err:
        raise ImportError("finding label issues needs cleanlab: pip install cleanlab "
                          "(in requirements.txt)") from err


def label_lists(targets: np.ndarray) -> list[list[int]]:
    """cleanlab's multi-label form of multi-hot ``targets`` (N, C): per image the list of its
    class indices, ascending ([] for none)."""
    return [np.flatnonzero(row).tolist() for row in np.asarray(targets)]


def find_issues(labels: np.ndarray, probs: np.ndarray,
                task: "Task | str" = MULTICLASS) -> np.ndarray:
    """The images whose given label is likely wrong, most likely first: cleanlab's
    ``find_label_issues(labels, probs, return_indices_ranked_by="self_confidence")`` (one
    process: ``n_jobs=1``, the same result). For a multi-hot ``task`` that is cleanlab's
    multi-label form, ``cleanlab.multilabel_classification.filter.find_label_issues``
    (what ``cleanlab.filter.find_label_issues(..., multi_label=True)`` runs, without its
    deprecation): each class checked one-vs-rest, an image flagged when any of its classes is,
    ranked by ``multilabel_quality_scores`` (lowest first).

    Args:
        labels: int (N,) given labels, 0..C-1; multi-hot task: (N, C) multi-hot (0/1).
        probs: float (N, C) out-of-sample probabilities: rows summing to 1 (softmax), or
            independent per class (sigmoid) for a multi-hot task.
        task: The ``Task`` (or its name) the probabilities are of.

    Returns:
        numpy.ndarray: int64 positions into ``labels``, ranked.

    Raises:
        ImportError: Without cleanlab (requirements.txt).
        ValueError: As cleanlab, e.g. for a class of one value (multi-label: every image, or
            none, holds it).
    """
    probs = np.asarray(probs, np.float64)
    if get_task(task).multi_hot:
        ranked = _cleanlab("multilabel_classification.filter").find_label_issues(
            label_lists(labels), probs, return_indices_ranked_by="self_confidence", n_jobs=1)
    else:
        ranked = _cleanlab("filter").find_label_issues(
            np.asarray(labels, np.int64), probs, return_indices_ranked_by="self_confidence",
            n_jobs=1)
    return np.asarray(ranked, np.int64)


def multilabel_quality_scores(targets: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """cleanlab's multi-label label quality score of each image
    (``cleanlab.multilabel_classification.rank.get_label_quality_scores``, its defaults):
    per class the self-confidence of the given value (p if the class is given, else 1 - p),
    aggregated over the classes by an exponential moving average (alpha 0.8) of those scores
    sorted from high to low, so that the worst class weighs most; in [0, 1], lower is more
    likely wrong. ``find_issues`` ranks by it.

    Args:
        targets: (N, C) multi-hot given labels.
        probs: float (N, C) out-of-sample sigmoid probabilities.

    Returns:
        numpy.ndarray: float64 (N,).
    """
    rank = _cleanlab("multilabel_classification.rank")
    return np.asarray(rank.get_label_quality_scores(
        label_lists(targets), np.asarray(probs, np.float64)), np.float64)


def issue_rows(ranked: np.ndarray, *, paths: Sequence[str], labels: np.ndarray,
               probs: np.ndarray, class_names: Sequence[str],
               task: "Task | str" = MULTICLASS) -> list[dict]:
    """One row per ranked image: ``path``, ``given_label`` and ``suggested_label``,
    ``score``, and for the page ``removed`` and ``added`` (lists of class names) with
    ``probabilities`` (class name -> its probability, of the classes named); numbers rounded
    to 6 decimals.

    One class per image: the suggested label is the most probable class other than the given
    one (the first of a tie); ``score`` is self-confidence, the probability of the given
    label; removed is the given class, added the suggested one.

    A multi-hot ``task``: ``given_label`` and ``suggested_label`` are class names separated by
    spaces (a label file's form), the suggested ones those of probability >=
    ``DEFAULT_THRESHOLD`` (0.5; "" when none); ``score`` is ``multilabel_quality_scores``;
    removed are the given classes not suggested, added the suggested classes not given.
    """
    multi_hot = get_task(task).multi_hot
    scores = multilabel_quality_scores(labels, probs) if multi_hot else None
    rows = []
    for i in ranked:
        p = np.asarray(probs[i], np.float64)
        if multi_hot:
            given = np.flatnonzero(labels[i])
            suggested = np.flatnonzero(p >= DEFAULT_THRESHOLD)
            score = scores[i]
            removed, added = np.setdiff1d(given, suggested), np.setdiff1d(suggested, given)
        else:
            given = [int(labels[i])]
            others = p.copy()
            others[given] = -1.0
            suggested = [int(np.argmax(others))]
            score = p[given[0]]
            removed, added = given, suggested
        rows.append({"path": paths[i],
                     "given_label": " ".join(class_names[k] for k in given),
                     "suggested_label": " ".join(class_names[k] for k in suggested),
                     "score": round(float(score), 6),
                     "removed": [class_names[k] for k in removed],
                     "added": [class_names[k] for k in added],
                     "probabilities": {class_names[k]: round(float(p[k]), 6)
                                       for k in (*given, *suggested)}})
    return rows


def out_of_fold_score(labels: np.ndarray, probs: np.ndarray,
                      task: "Task | str" = MULTICLASS) -> dict:
    """How well the out-of-fold probabilities agree with the given labels, for the summary:
    ``out_of_fold_accuracy`` (top-1 against the given class), or for a multi-hot task
    ``out_of_fold_mAP`` (mean over the classes of the average precision of the probabilities
    against the given labels: ``mean_average_precision``); rounded to 6 decimals. Both are
    measured against the given labels, the errors sought included."""
    if get_task(task).multi_hot:
        return {"out_of_fold_mAP": round(float(mean_average_precision(probs, labels)), 6)}
    return {"out_of_fold_accuracy": round(float((np.asarray(probs).argmax(1)
                                                 == np.asarray(labels)).mean()), 6)}


def issues_csv(rows: Sequence[dict]) -> str:
    """``label_issues.csv``: ``CSV_HEADER``, then the rows in rank order."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    writer.writerows([row[key] for key in CSV_HEADER] for row in rows)
    return out.getvalue()


def _label_set(names: str, prob: dict, marked: list, kind: str, mark: tuple[str, str]) -> str:
    """A card's label set: each of ``names`` (separated by spaces) with its probability, in a
    span of class ``kind``, or of ``mark``'s class behind its sign when in ``marked``;
    "none" for an empty set."""
    return " ".join(f'<span class="{mark[0] if name in marked else kind}">'
                    f'{mark[1] if name in marked else ""}{esc(name)} ({prob[name]:.3f})</span>'
                    for name in names.split()) or "none"


def issue_card(rank: int, row: dict, exif_transpose: bool, multi_hot: bool = False) -> str:
    """One likely label error: its thumbnail, given and suggested label with their
    probabilities, score, path. ``multi_hot``: the given and the suggested set, each class
    with its probability, those to remove marked - (struck through), those to add +."""
    prob = row["probabilities"]
    if multi_hot:
        given = _label_set(row["given_label"], prob, row["removed"], "given",
                           ("removed", "&minus;"))
        suggested = _label_set(row["suggested_label"], prob, row["added"], "suggested",
                               ("added", "+"))
        lines = (f"<div>#{rank} given {given}</div>"
                 f'<div>suggested {suggested}</div><div>score {row["score"]:.3f}</div>')
    else:
        given, suggested = row["given_label"], row["suggested_label"]
        lines = (f'<div>#{rank} given <b class="given">{esc(given)}</b> '
                 f"({prob[given]:.3f})</div>"
                 f'<div>suggested <b class="suggested">{esc(suggested)}</b> '
                 f"({prob[suggested]:.3f})</div>")
    return (f'<div class="card issue" data-rank="{rank}">'
            f'{image_tag(row["path"], "image", exif_transpose)}{lines}'
            f'<div class="path">{esc(row["path"])}</div></div>')


def class_counts_table(rows: Sequence[dict], labels: np.ndarray, class_names: Sequence[str],
                       multi_hot: bool = False) -> str:
    """A sortable table: per class, its images and the issues that would remove it (given
    it) and that would add it (suggesting it). ``multi_hot``: ``labels`` (N, C), the images
    holding the class."""
    removed = {name: 0 for name in class_names}
    added = dict(removed)
    for row in rows:
        for name in row["removed"]:
            removed[name] += 1
        for name in row["added"]:
            added[name] += 1
    labels = np.asarray(labels)
    images = (labels.sum(0, dtype=np.int64) if multi_hot
              else np.bincount(labels.astype(np.int64), minlength=len(class_names)))
    columns = (("images holding it", "issues where it would be removed",
                "issues where it would be added") if multi_hot
               else ("images", "issues given it", "issues suggesting it"))
    heads = "".join(f'<th class="{kind}" data-type="{kind}">{name}</th>' for name, kind in (
        ("class", "text"), *((column, "number") for column in columns)))
    body = "".join(f'<tr><td class="text">{esc(name)}</td><td>{images[k]}</td>'
                   f"<td>{removed[name]}</td><td>{added[name]}</td></tr>"
                   for k, name in enumerate(class_names))
    return (f'<table id="per-class" class="sortable"><thead><tr>{heads}</tr></thead>'
            f"<tbody>{body}</tbody></table>")


def issues_page(rows: Sequence[dict], *, summary: dict, labels: np.ndarray,
                class_names: Sequence[str], shown: int, exif_transpose: bool = False,
                task: "Task | str" = MULTICLASS) -> str:
    """``label_issues.html``: the headline numbers of ``summary`` (``images``, ``issues``,
    ``folds``, ``out_of_fold_accuracy`` or ``out_of_fold_mAP``), the per-class counts, then
    the first ``shown`` issues in rank order as cards (``issue_card``); self-contained
    (thumbnails embedded)."""
    multi_hot = get_task(task).multi_hot
    title = f"Likely label errors in {summary.get('data_path', '')}"
    cards = "".join(issue_card(rank, row, exif_transpose, multi_hot)
                    for rank, row in enumerate(rows[:shown], 1))
    order = ("the lowest multi-label label quality score: the worst class of an image weighs "
             "most" if multi_hot else "the lowest probability of the given label")
    listed = (f"<p>{len(rows)} likely label errors, most likely first ({order}); the first "
              f"{min(shown, len(rows))} shown, all in label_issues.csv</p>" if rows
              else "<p>no likely label errors found</p>")
    parts = [f"<h1>{esc(title)}</h1>",
             headline(summary, (("images", "images"), ("issues", "likely label errors"),
                                ("folds", "folds"),
                                ("out_of_fold_accuracy", "out-of-fold accuracy"),
                                ("out_of_fold_mAP", "out-of-fold mAP"))),
             '<h2 id="classes">Classes</h2>',
             class_counts_table(rows, labels, class_names, multi_hot),
             '<h2 id="issues">Likely label errors</h2>', listed,
             f'<div class="cards">{cards}</div>']
    return (f'<!DOCTYPE html>\n<html lang="en" data-errors="0"><head><meta charset="utf-8">'
            f"<title>{esc(title)}</title><style>{PAGE_STYLE}</style>"
            f"<script>{ERROR_COUNTER}</script></head>\n<body>\n" + "\n".join(parts)
            + f"\n<script>{SCRIPT}</script>\n</body></html>\n")
