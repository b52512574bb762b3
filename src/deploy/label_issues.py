"""Likely label errors from out-of-sample probabilities: confident learning (Northcutt et al.
2021, "Confident Learning: Estimating Uncertainty in Dataset Labels", JAIR; cleanlab's
``find_label_issues``, its default ``prune_by_noise_rate`` rule) ranked by self-confidence
(the probability of the given label, lowest first), and what ``label_issues.py`` writes of
them: ``label_issues.csv`` and the self-contained page ``label_issues.html`` (thumbnails, the
given and the suggested class on each; every text escaped). See docs/label_issues.md.
"""
import csv
import io
from collections.abc import Sequence

import numpy as np

from src.deploy.report_page import ERROR_COUNTER, SCRIPT, STYLE, esc, headline, image_tag

CSV_HEADER = ("path", "given_label", "suggested_label", "score")
PAGE_STYLE = STYLE + ".given{color:#a40}.suggested{color:#063}\n"


def find_issues(labels: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """The images whose given label is likely wrong, most likely first: cleanlab's
    ``find_label_issues(labels, probs, return_indices_ranked_by="self_confidence")`` (one
    process: ``n_jobs=1``, the same result).

    Args:
        labels: int (N,) given labels, 0..C-1.
        probs: float (N, C) out-of-sample probabilities, rows summing to 1.

    Returns:
        numpy.ndarray: int64 positions into ``labels``, ranked.

    Raises:
        ImportError: Without cleanlab (requirements.txt).
    """
    try:
        from cleanlab.filter import find_label_issues
    except ImportError as err:
        raise ImportError("finding label issues needs cleanlab: pip install cleanlab "
                          "(in requirements.txt)") from err
    ranked = find_label_issues(np.asarray(labels, np.int64), np.asarray(probs, np.float64),
                               return_indices_ranked_by="self_confidence", n_jobs=1)
    return np.asarray(ranked, np.int64)


def issue_rows(ranked: np.ndarray, *, paths: Sequence[str], labels: np.ndarray,
               probs: np.ndarray, class_names: Sequence[str]) -> list[dict]:
    """One row per ranked image: ``path``, ``given_label`` and ``suggested_label`` (class
    names: the suggested one is the most probable class other than the given one), ``score``
    (self-confidence: the probability of the given label) and ``suggested_probability``, both
    rounded to 6 decimals."""
    rows = []
    for i in ranked:
        given = int(labels[i])
        others = np.array(probs[i], np.float64)
        others[given] = -1.0
        suggested = int(np.argmax(others))
        rows.append({"path": paths[i], "given_label": class_names[given],
                     "suggested_label": class_names[suggested],
                     "score": round(float(probs[i][given]), 6),
                     "suggested_probability": round(float(probs[i][suggested]), 6)})
    return rows


def issues_csv(rows: Sequence[dict]) -> str:
    """``label_issues.csv``: ``CSV_HEADER``, then the rows in rank order."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    writer.writerows([row[key] for key in CSV_HEADER] for row in rows)
    return out.getvalue()


def issue_card(rank: int, row: dict, exif_transpose: bool) -> str:
    """One likely label error: its thumbnail, given and suggested class, score, path."""
    return (f'<div class="card issue" data-rank="{rank}">'
            f'{image_tag(row["path"], "image", exif_transpose)}'
            f'<div>#{rank} given <b class="given">{esc(row["given_label"])}</b> '
            f'({row["score"]:.3f})</div>'
            f'<div>suggested <b class="suggested">{esc(row["suggested_label"])}</b> '
            f'({row["suggested_probability"]:.3f})</div>'
            f'<div class="path">{esc(row["path"])}</div></div>')


def class_counts_table(rows: Sequence[dict], labels: np.ndarray,
                       class_names: Sequence[str]) -> str:
    """A sortable table: per class, its images, the issues given it and those suggesting it."""
    given = {name: 0 for name in class_names}
    suggested = dict(given)
    for row in rows:
        given[row["given_label"]] += 1
        suggested[row["suggested_label"]] += 1
    images = np.bincount(np.asarray(labels, np.int64), minlength=len(class_names))
    heads = "".join(f'<th class="{kind}" data-type="{kind}">{name}</th>' for name, kind in (
        ("class", "text"), ("images", "number"), ("issues given it", "number"),
        ("issues suggesting it", "number")))
    body = "".join(f'<tr><td class="text">{esc(name)}</td><td>{images[k]}</td>'
                   f"<td>{given[name]}</td><td>{suggested[name]}</td></tr>"
                   for k, name in enumerate(class_names))
    return (f'<table id="per-class" class="sortable"><thead><tr>{heads}</tr></thead>'
            f"<tbody>{body}</tbody></table>")


def issues_page(rows: Sequence[dict], *, summary: dict, labels: np.ndarray,
                class_names: Sequence[str], shown: int, exif_transpose: bool = False) -> str:
    """``label_issues.html``: the headline numbers of ``summary`` (``images``, ``issues``,
    ``folds``, ``out_of_fold_accuracy``), the per-class counts, then the first ``shown`` issues
    in rank order as cards (``issue_card``); self-contained (thumbnails embedded)."""
    title = f"Likely label errors in {summary.get('data_path', '')}"
    cards = "".join(issue_card(rank, row, exif_transpose)
                    for rank, row in enumerate(rows[:shown], 1))
    listed = (f"<p>{len(rows)} likely label errors, most likely first (the lowest probability "
              f"of the given label); the first {min(shown, len(rows))} shown, all in "
              f"label_issues.csv</p>" if rows else "<p>no likely label errors found</p>")
    parts = [f"<h1>{esc(title)}</h1>",
             headline(summary, (("images", "images"), ("issues", "likely label errors"),
                                ("folds", "folds"),
                                ("out_of_fold_accuracy", "out-of-fold accuracy"))),
             '<h2 id="classes">Classes</h2>', class_counts_table(rows, labels, class_names),
             '<h2 id="issues">Likely label errors</h2>', listed,
             f'<div class="cards">{cards}</div>']
    return (f'<!DOCTYPE html>\n<html lang="en" data-errors="0"><head><meta charset="utf-8">'
            f"<title>{esc(title)}</title><style>{PAGE_STYLE}</style>"
            f"<script>{ERROR_COUNTER}</script></head>\n<body>\n" + "\n".join(parts)
            + f"\n<script>{SCRIPT}</script>\n</body></html>\n")
