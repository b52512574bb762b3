"""Transfer on real data we have: pretrain ResNet-18 on CIFAR-10 without two of its classes,
then fine-tune on those two classes from ~100 training images each, and evaluate on their
real test images (1,000 each), for: training from scratch, full fine-tuning, a linear probe
(``trainable_layers 0``), LP-FT (``linear_probe_epochs``) and full fine-tuning with
``freeze_bn``. Every command is printed as it runs, so a run can be repeated by hand.

    python benchmarks/transfer_experiment.py --cifar_root ../shared/data/cifar10 \
        --work_dir output/transfer      # pretraining ~30 min on 2 cores, then ~1 min a run
    python benchmarks/transfer_experiment.py ... \
        --pretrained output/transfer/pretrain/resnet18-10_312.ckpt     # reuse a pretraining

Writes ``work_dir/results_seeds_<seeds>.json`` and prints a Markdown table (top-1 on the
held-out classes' test images per seed, their mean, training wall time); ``--plot_run NAME``
also keeps that run's confusion matrix PNG (``eval.py --plot true``) as
``work_dir/confusion_NAME_seedSEED.png``.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = "configs/resnet18_cifar10.yaml"
# The fine-tuning recipe shared by every run (the pretraining's recipe, shorter and gentler):
# batch 32 (6 steps per epoch on 200 images), 30 epochs, peak LR 0.0125, 2 warmup epochs.
FINETUNE = ["--class_num", "2", "--batch_size", "32", "--epoch_size", "30", "--base_lr", "0.1",
            "--warmup_epochs", "2", "--save_checkpoint_epochs", "30", "--log_interval", "100",
            "--run_eval", "false"]
#: name -> (uses the pretrained weights, extra train.py arguments)
RUNS = {
    "scratch": (False, []),
    "full_finetune": (True, []),
    "linear_probe": (True, ["--trainable_layers", "0"]),
    "lp_ft": (True, ["--linear_probe_epochs", "10"]),
    "finetune_freeze_bn": (True, ["--freeze_bn", "true"]),
    # the choices of configs/resnet50_finetune.yaml together (LP-FT over a third of the run)
    "recipe_choices": (True, ["--trainable_layers", "3", "--freeze_bn", "true",
                              "--linear_probe_epochs", "10"]),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cifar_root", required=True,
                        help="CIFAR-10 as JPEG class folders: train/<class>, test/<class>")
    parser.add_argument("--work_dir", default="output/transfer")
    parser.add_argument("--held_out", default="cat,dog", help="the two fine-tuning classes")
    parser.add_argument("--train_per_class", type=int, default=100)
    parser.add_argument("--pretrained", default="",
                        help="checkpoint of an earlier pretraining (skips it)")
    parser.add_argument("--runs", default=",".join(RUNS), help="comma-separated names")
    parser.add_argument("--seeds", default="1", help="comma-separated seeds of each run")
    parser.add_argument("--plot_run", default="lp_ft")
    return parser.parse_args(argv)


def copy_classes(src, dst, classes, per_class=None):
    """Copy class folders (the first ``per_class`` files of each, sorted) from src to dst."""
    for name in classes:
        os.makedirs(os.path.join(dst, name), exist_ok=True)
        files = sorted(os.listdir(os.path.join(src, name)))[:per_class]
        for file in files:
            target = os.path.join(dst, name, file)
            if not os.path.exists(target):
                shutil.copyfile(os.path.join(src, name, file), target)
    return dst


def run(cmd):
    """Run a command from the project root, echoing it; returns its wall time in seconds."""
    print("+", " ".join(cmd), flush=True)
    start = time.time()
    subprocess.run([sys.executable, *cmd], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return time.time() - start


def main(argv=None):
    args = parse_args(argv)
    held_out = args.held_out.split(",")
    classes = sorted(os.listdir(os.path.join(args.cifar_root, "train")))
    kept = [c for c in classes if c not in held_out]
    data = os.path.join(args.work_dir, "data")
    pretrained = args.pretrained
    if not pretrained:
        for split in ("train", "test"):
            copy_classes(os.path.join(args.cifar_root, split),
                         os.path.join(data, "pretrain", split), kept)
        out = os.path.join(args.work_dir, "pretrain")
        seconds = run(["train.py", "--config_path", RECIPE, "--data_path",
                       os.path.join(data, "pretrain", "train"), "--class_num", str(len(kept)),
                       "--run_eval", "false", "--output_dir", out])
        print(f"pretraining: {seconds / 60:.1f} min")
        pretrained = max((os.path.join(out, n) for n in os.listdir(out)
                          if n.startswith("resnet18-") and n.endswith(".ckpt")
                          and "best" not in n), key=os.path.getmtime)
    train_dir = copy_classes(os.path.join(args.cifar_root, "train"),
                             os.path.join(data, "finetune", "train"), held_out,
                             args.train_per_class)
    test_dir = copy_classes(os.path.join(args.cifar_root, "test"),
                            os.path.join(data, "finetune", "test"), held_out)
    results = []
    for seed in args.seeds.split(","):
        for name in args.runs.split(","):
            uses_weights, extra = RUNS[name]
            out = os.path.join(args.work_dir, f"{name}_seed{seed}")
            train_s = run(["train.py", "--config_path", RECIPE, *FINETUNE, "--data_path",
                           train_dir, "--output_dir", out, "--overwrite", "true", "--seed", seed,
                           *(["--pre_trained", pretrained] if uses_weights else []), *extra])
            ckpt = os.path.join(out, "resnet18-30_6.ckpt")
            plot = name == args.plot_run
            eval_s = run(["eval.py", "--config_path", RECIPE, "--class_num", "2",
                          "--checkpoint_path", ckpt, "--data_path", test_dir, "--output_dir",
                          out, "--use_ema", "false", "--plot", "true" if plot else "false"])
            with open(os.path.join(out, "eval_result.json")) as f:
                result = json.load(f)
            if plot:
                shutil.copyfile(os.path.join(out, "confusion_matrix.png"),
                                os.path.join(args.work_dir, f"confusion_{name}_seed{seed}.png"))
            results.append({"run": name, "seed": int(seed), "top1": result["top1"],
                            "images": result["images"], "train_s": round(train_s, 1),
                            "eval_s": round(eval_s, 1), "args": extra,
                            "pretrained": pretrained if uses_weights else ""})
            print(json.dumps(results[-1]), flush=True)
    write_results(args.work_dir, args.seeds, results)
    return 0


def write_results(work_dir, seeds, results):
    """``work_dir/results_seeds_<seeds>.json`` (``seeds`` as given, comma-separated), and
    the Markdown table of ``summary_table`` printed."""
    name = f"results_seeds_{seeds.replace(',', '_')}.json"
    with open(os.path.join(work_dir, name), "w") as f:
        json.dump(results, f, indent=1)
    print(summary_table(results))


def summary_table(results):
    """Markdown: per run, top-1 of each seed, their mean, and the mean train time."""
    lines = ["| run | top-1 per seed | mean | train time (mean) |", "|---|---|---|---|"]
    for name in dict.fromkeys(r["run"] for r in results):
        rows = [r for r in results if r["run"] == name]
        top1 = [100 * r["top1"] for r in rows]
        lines.append(f"| {name} | {', '.join(f'{t:.2f}%' for t in top1)} | "
                     f"{sum(top1) / len(top1):.2f}% | "
                     f"{sum(r['train_s'] for r in rows) / len(rows):.0f} s |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
