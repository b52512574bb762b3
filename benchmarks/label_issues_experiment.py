"""Precision and recall of label_issues.py against label noise put in on purpose: the first
``--per_class`` images of each class folder of ``--source`` are copied into
``work_dir/data``, a seeded ``--noise`` fraction of them moved into another class folder
(uniform over the others), then label_issues.py runs on it with the arguments after ``--``,
and its ``label_issues.csv`` is compared with the images moved.

    python benchmarks/label_issues_experiment.py --source ../shared/data/cifar10/train \
        --per_class 300 --noise 0.1 --work_dir output/label_noise -- \
        --config_path configs/resnet18_cifar10.yaml --label_folds 3 --epoch_size 15 \
        --batch_size 64 --save_checkpoint_epochs 5 --log_interval 100

Rerun the same command to resume (the copy and its noise are kept, label_issues.py resumes
its folds). Writes ``work_dir/result.json``: precision, recall and F1 of the issues found,
the precision of the first 50, 100 and (number moved) rows of the ranking, the out-of-fold accuracy
against the true and the given labels, and the wall and CPU time of label_issues.py and its
folds (this process's children), summed over the invocations of the work_dir (each one a
line of ``times.jsonl``); ``--result FILE`` writes a copy. docs/label_issues.md.
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
MOVED_FILE = "moved.csv"  # in work_dir: path (after the move), true class, given class
TIMES_FILE = "times.jsonl"  # in work_dir: one line per invocation, its wall and CPU seconds


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", required=True, help="class folders of real images")
    parser.add_argument("--per_class", type=int, default=300)
    parser.add_argument("--noise", type=float, default=0.1, help="fraction of labels moved")
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


def main(argv=None):
    args = parse_args(argv)
    data, out = os.path.join(args.work_dir, "data"), os.path.join(args.work_dir, "out")
    moved_file = os.path.join(args.work_dir, MOVED_FILE)
    if not os.path.isfile(moved_file):
        shutil.rmtree(data, ignore_errors=True)
        moved = make_noisy_copy(args.source, data, args.per_class, args.noise, args.seed)
        with open(moved_file, "w", encoding="utf-8", newline="") as f:
            csv.writer(f).writerows([("path", "true", "given"), *moved])
    with open(moved_file, encoding="utf-8") as f:
        moved = {row["path"]: row["true"] for row in csv.DictReader(f)}
    command = [sys.executable, os.path.join(ROOT, "label_issues.py"), "--data_path", data,
               "--output_dir", out, *args.label_issues_args]
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
        found = [os.path.relpath(row["path"], data) for row in csv.DictReader(f)]
    with np.load(os.path.join(out, "out_of_fold.npz")) as saved:
        paths, labels = list(saved["paths"]), saved["labels"]
        predicted, names = saved["probabilities"].argmax(1), list(saved["class_names"])
    true = np.array([names.index(moved.get(p, p.split("/")[0])) for p in paths])
    result = dict(scores(found, list(moved), len(paths)),
                  out_of_fold_accuracy_true=round(float((predicted == true).mean()), 4),
                  out_of_fold_accuracy_given=round(float((predicted == labels).mean()), 4),
                  wall_s=sum(r["wall_s"] for r in runs), cpu_s=sum(r["cpu_s"] for r in runs),
                  invocations=len(runs),
                  per_class=args.per_class, noise=args.noise, seed=args.seed,
                  label_issues_args=args.label_issues_args)
    text = json.dumps(result, indent=1)
    print(text)
    for path in [os.path.join(args.work_dir, "result.json")] + ([args.result] if args.result
                                                                 else []):
        with open(path, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
