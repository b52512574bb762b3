"""Precision and recall of label_issues.py against label noise put in on purpose, on class
folders or on a multi-label table, then label_issues.py runs on the noisy copy with the
arguments after ``--``, and its ``label_issues.csv`` is compared with the images changed.

Class folders: the first ``--per_class`` images of each class folder of ``--source`` are
copied into ``work_dir/data`` and a seeded ``--noise`` fraction of them moved into another
class folder (uniform over the others):

    python benchmarks/label_issues_experiment.py --source ../shared/data/cifar10/train \
        --per_class 300 --noise 0.1 --work_dir output/label_noise -- \
        --config_path configs/resnet18_cifar10.yaml --label_folds 3 --epoch_size 15 \
        --batch_size 64 --save_checkpoint_epochs 5 --log_interval 100

A multi-label table (``--label_file``, rows relative to ``--source``): its images are copied
into ``work_dir/data`` (same relative paths) and a seeded ``--noise`` fraction of its rows
changed, each one class removed or one class it lacks added (a seeded coin: one of the two,
the other when the row has no class to remove or none to add), written as
``work_dir/data/train.csv``; label_issues.py is given ``--data_path`` and ``--label_file``:

    python benchmarks/label_issues_experiment.py --source data/cifar10_mosaics \
        --label_file data/cifar10_mosaics/train.csv --noise 0.1 \
        --work_dir output/label_noise_multilabel -- \
        --config_path configs/multilabel_quick_start.yaml --label_folds 3 --epoch_size 30 \
        --save_checkpoint_epochs 10 --log_interval 100

``moved.csv`` in work_dir records each change (class folders: path after the move, true and
given class; a table: path, true and given classes, ``removed`` or ``added`` and the class).
Rerun the same command to resume (the copy and its noise are kept, label_issues.py resumes
its folds). Writes ``work_dir/result.json``: precision, recall and F1 of the issues found,
the precision of the first 50, 100 and (number changed) rows of the ranking, the out-of-fold
accuracy (a table: mAP) against the true and the given labels, a table's recall per kind of
change and how often the suggestion undoes a change found, and the wall and CPU time of
label_issues.py and its folds (this process's children), summed over the invocations of the
work_dir (each one a line of ``times.jsonl``); ``--result FILE`` writes a copy.
docs/label_issues.md.
"""
import argparse
import csv
import json
import os
import resource
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from src.utils.multilabel_metrics import mean_average_precision  # noqa: E402

MOVED_FILE = "moved.csv"  # in work_dir: each label changed on purpose
TIMES_FILE = "times.jsonl"  # in work_dir: one line per invocation, its wall and CPU seconds
TABLE_FILE = "train.csv"  # in work_dir/data: the noisy copy of --label_file


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", required=True,
                        help="class folders of real images, or the folder --label_file's rows "
                             "are relative to")
    parser.add_argument("--label_file", default="",
                        help="a multi-label table (image_name,tags CSV): its rows are changed")
    parser.add_argument("--per_class", type=int, default=300, help="class folders only")
    parser.add_argument("--noise", type=float, default=0.1,
                        help="fraction of labels moved (a table: of rows changed)")
    parser.add_argument("--seed", type=int, default=0, help="of the copy's noise")
    parser.add_argument("--work_dir", default="output/label_noise")
    parser.add_argument("--result", default="", help="also write the result JSON here")
    parser.add_argument("label_issues_args", nargs=argparse.REMAINDER,
                        help="after --: label_issues.py's arguments")
    args = parser.parse_args(argv)
    args.label_issues_args = [a for a in args.label_issues_args if a != "--"]
    return args


def make_noisy_copy(source, data, per_class, noise, seed):
    """Copy ``per_class`` images of each class of ``source`` into ``data`` and move a seeded
    ``noise`` fraction of them into another class folder (each renamed ``moved_<class>_<name>``
    so that no name meets another); return the moved as (path, true class, given class)."""
    classes = sorted(os.listdir(source))
    files = []
    for name in classes:
        os.makedirs(os.path.join(data, name))
        for image in sorted(os.listdir(os.path.join(source, name)))[:per_class]:
            shutil.copy(os.path.join(source, name, image), os.path.join(data, name, image))
            files.append((name, image))
    rng = np.random.default_rng(seed)
    moved = []
    for i in sorted(rng.choice(len(files), round(noise * len(files)), replace=False)):
        true, image = files[i]
        given = classes[(classes.index(true) + rng.integers(1, len(classes))) % len(classes)]
        target = os.path.join(data, given, f"moved_{true}_{image}")
        shutil.move(os.path.join(data, true, image), target)
        moved.append((os.path.relpath(target, data), true, given))
    return moved


def make_noisy_table(source, label_file, data, noise, seed):
    """Copy the images of ``label_file`` (rows relative to ``source``) into ``data`` at the same
    relative paths and write ``data/TABLE_FILE``: its rows with a seeded ``noise`` fraction
    changed, each one class removed or one class it lacks added (a coin per row; the other
    change when one is impossible). Returns the changed rows as (path, true classes, given
    classes, ``removed`` or ``added``, the class), classes separated by spaces."""
    with open(label_file, encoding="utf-8-sig", newline="") as f:
        table = [row for row in csv.reader(f) if row]
    header, rows = table[0], [(path.strip(), tags.split()) for path, tags in table[1:]]
    classes = sorted({name for _, tags in rows for name in tags})
    for path, _ in rows:
        os.makedirs(os.path.dirname(os.path.join(data, path)), exist_ok=True)
        shutil.copy(os.path.join(source, path), os.path.join(data, path))
    rng = np.random.default_rng(seed)
    given, moved = [list(tags) for _, tags in rows], []
    for i in sorted(rng.choice(len(rows), round(noise * len(rows)), replace=False)):
        absent = [name for name in classes if name not in given[i]]
        coin = rng.random() < 0.5
        remove = bool(given[i]) and (coin or not absent)
        pool = given[i] if remove else absent
        name = pool[rng.integers(len(pool))]
        given[i] = [c for c in given[i] if c != name] if remove else sorted(given[i] + [name],
                                                                         key=classes.index)
        moved.append((rows[i][0], " ".join(rows[i][1]), " ".join(given[i]),
                      "removed" if remove else "added", name))
    with open(os.path.join(data, TABLE_FILE), "w", encoding="utf-8", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(
            [header, *[(path, " ".join(tags)) for (path, _), tags in zip(rows, given)]])
    return moved


def scores(found, moved, count):
    """Precision, recall and F1 of the ``found`` paths (ranked) against the ``moved`` ones,
    and the precision of the first 50, 100 and ``len(moved)`` rows; ``count``: the images."""
    hits = len(set(found) & set(moved))
    precision = hits / len(found) if found else 0.0
    recall = hits / len(moved)
    first = {n: round(len(set(found[:n]) & set(moved)) / min(n, len(found)), 4)
             for n in (50, 100, len(moved)) if found}
    return {"images": count, "moved": len(moved), "found": len(found), "found_moved": hits,
            "precision": round(precision, 4), "recall": round(recall, 4),
            "f1": round(2 * precision * recall / (precision + recall), 4) if hits else 0.0,
            "precision_of_first_rows": first}


def folder_quality(out, moved):
    """Class folders: the out-of-fold top-1 accuracy against the true and the given classes."""
    with np.load(os.path.join(out, "out_of_fold.npz")) as saved:
        paths, labels = list(saved["paths"]), saved["labels"]
        predicted, names = saved["probabilities"].argmax(1), list(saved["class_names"])
    true = np.array([names.index(moved[p]["true"] if p in moved else p.split("/")[0])
                     for p in paths])
    return {"out_of_fold_accuracy_true": round(float((predicted == true).mean()), 4),
            "out_of_fold_accuracy_given": round(float((predicted == labels).mean()), 4)}


def table_quality(out, moved, found_rows):
    """A table: the out-of-fold mAP against the true and the given labels, the recall of each
    kind of change, and of the changed rows found, the fraction whose suggested classes undo
    the change (the removed class suggested again, the added one not suggested)."""
    with np.load(os.path.join(out, "out_of_fold.npz")) as saved:
        paths, given, probs = list(saved["paths"]), saved["labels"], saved["probabilities"]
        names = list(saved["class_names"])
    true = given.copy()
    for i, path in enumerate(paths):
        if path in moved:
            true[i] = [name in moved[path]["true"].split() for name in names]
    result = {"out_of_fold_mAP_true": round(mean_average_precision(probs, true), 4),
              "out_of_fold_mAP_given": round(mean_average_precision(probs, given), 4)}
    for kind in ("removed", "added"):
        changed = [p for p, row in moved.items() if row["change"] == kind]
        result[f"recall_{kind}"] = round(sum(p in found_rows for p in changed)
                                         / max(1, len(changed)), 4)
        result[f"moved_{kind}"] = len(changed)
    hits = [p for p in found_rows if p in moved]
    undone = [p for p in hits if (moved[p]["class"] in found_rows[p]["suggested_label"].split())
              == (moved[p]["change"] == "removed")]
    result["suggestion_undoes_change"] = round(len(undone) / max(1, len(hits)), 4)
    return result


def main(argv=None):
    args = parse_args(argv)
    data, out = os.path.join(args.work_dir, "data"), os.path.join(args.work_dir, "out")
    moved_file = os.path.join(args.work_dir, MOVED_FILE)
    if not os.path.isfile(moved_file):
        shutil.rmtree(data, ignore_errors=True)
        if args.label_file:
            header = ("path", "true", "given", "change", "class")
            moved = make_noisy_table(args.source, args.label_file, data, args.noise, args.seed)
        else:
            header = ("path", "true", "given")
            moved = make_noisy_copy(args.source, data, args.per_class, args.noise, args.seed)
        with open(moved_file, "w", encoding="utf-8", newline="") as f:
            csv.writer(f).writerows([header, *moved])
    with open(moved_file, encoding="utf-8") as f:
        moved = {row["path"]: row for row in csv.DictReader(f)}
    table = ["--label_file", os.path.join(data, TABLE_FILE)] if args.label_file else []
    command = [sys.executable, os.path.join(ROOT, "label_issues.py"), "--data_path", data,
               *table, "--output_dir", out, *args.label_issues_args]
    print(" ".join(command), flush=True)
    start = time.time()
    subprocess.run(command, check=True, cwd=ROOT)
    wall = time.time() - start
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(os.path.join(args.work_dir, TIMES_FILE), "a", encoding="utf-8") as f:
        f.write(json.dumps({"wall_s": round(wall), "cpu_s": round(used.ru_utime + used.ru_stime),
                            "label_issues_args": args.label_issues_args}) + "\n")
    with open(os.path.join(args.work_dir, TIMES_FILE), encoding="utf-8") as f:
        runs = [json.loads(line) for line in f if line.strip()]
    with open(os.path.join(out, "label_issues.csv"), encoding="utf-8") as f:
        found_rows = {os.path.relpath(row["path"], data): row for row in csv.DictReader(f)}
    found = list(found_rows)  # in rank order
    quality = (table_quality(out, moved, found_rows) if args.label_file
               else folder_quality(out, moved))
    with np.load(os.path.join(out, "out_of_fold.npz")) as saved:
        count = len(saved["paths"])
    result = dict(scores(found, list(moved), count), **quality,
                  wall_s=sum(r["wall_s"] for r in runs), cpu_s=sum(r["cpu_s"] for r in runs),
                  invocations=len(runs),
                  **({"label_file": args.label_file} if args.label_file
                     else {"per_class": args.per_class}),
                  noise=args.noise, seed=args.seed, label_issues_args=args.label_issues_args)
    text = json.dumps(result, indent=1)
    print(text)
    for path in [os.path.join(args.work_dir, "result.json")] + ([args.result] if args.result
                                                                 else []):
        with open(path, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
