"""Does a teacher help, on real data we have: train a teacher on a CIFAR-10 subset (JPEG class
folders), then a ResNet-18 student on the same images with and without knowledge distillation
(``kd_teacher``), the same epochs and seeds, and evaluate every network on the 10,000 real
test images. Every command is printed as it runs, so a run can be repeated by hand.

    python benchmarks/distill_experiment.py --cifar_root ../shared/data/cifar10 \
        --work_dir output/distill --seeds 1,2
    python benchmarks/distill_experiment.py ... --teacher output/distill/teacher/resnet34-best.ckpt

Writes ``work_dir/results_seeds_<seeds>.json`` and prints a Markdown table (top-1 per seed,
their mean, training wall time). Recipe: ``configs/resnet18_cifar10.yaml`` with
``--epoch_size`` per network; the distillation keys are config.yaml's defaults (logit, T = 4,
both loss weights 1.0) unless given with ``--kd_args``.
"""
import argparse
import json
import os
import sys

from transfer_experiment import copy_classes, run, write_results

RECIPE = "configs/resnet18_cifar10.yaml"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cifar_root", required=True,
                        help="CIFAR-10 as JPEG class folders: train/<class>, test/<class>")
    parser.add_argument("--work_dir", default="output/distill")
    parser.add_argument("--train_per_class", type=int, default=500)
    parser.add_argument("--teacher_net", default="resnet34")
    parser.add_argument("--teacher_epochs", type=int, default=10)
    parser.add_argument("--teacher", default="", help="checkpoint of an earlier teacher run")
    parser.add_argument("--student_epochs", type=int, default=6)
    parser.add_argument("--seeds", default="1,2", help="comma-separated seeds of each student")
    parser.add_argument("--kd_args", default="", help="extra train.py arguments of the KD runs")
    return parser.parse_args(argv)


def train_and_eval(name, net, epochs, seed, train_dir, test_dir, work_dir, extra=()):
    """One train.py run and eval.py of its last checkpoint on ``test_dir``: a result dict."""
    out = os.path.join(work_dir, name)
    train_s = run(["train.py", "--config_path", RECIPE, "--net_name", net, "--data_path",
                   train_dir, "--epoch_size", str(epochs), "--seed", str(seed), "--run_eval",
                   "false", "--save_checkpoint_epochs", str(epochs), "--output_dir", out,
                   "--overwrite", "true", *extra])
    ckpt = max((os.path.join(out, n) for n in os.listdir(out)
                if n.startswith(f"{net}-") and n.endswith(".ckpt")), key=os.path.getmtime)
    eval_s = run(["eval.py", "--config_path", RECIPE, "--net_name", net, "--checkpoint_path",
                  ckpt, "--data_path", test_dir, "--output_dir", out, "--cam_images", "0"])
    with open(os.path.join(out, "eval_result.json")) as f:
        result = json.load(f)
    return {"run": name.rsplit("_seed", 1)[0], "net": net, "seed": seed, "epochs": epochs,
            "top1": result["top1"], "images": result["images"], "checkpoint": ckpt,
            "train_s": round(train_s, 1), "eval_s": round(eval_s, 1), "args": list(extra)}


def main(argv=None):
    args = parse_args(argv)
    classes = sorted(os.listdir(os.path.join(args.cifar_root, "train")))
    data = os.path.join(args.work_dir, "data")
    train_dir = copy_classes(os.path.join(args.cifar_root, "train"), os.path.join(data, "train"),
                             classes, args.train_per_class)
    test_dir = os.path.join(args.cifar_root, "test")
    results, teacher = [], args.teacher
    if not teacher:
        results.append(train_and_eval("teacher", args.teacher_net, args.teacher_epochs, 1,
                                      train_dir, test_dir, args.work_dir))
        teacher = results[-1]["checkpoint"]
        print(json.dumps(results[-1]), flush=True)
    kd = ["--kd_teacher", teacher, "--kd_net_name", args.teacher_net, *args.kd_args.split()]
    for seed in (int(s) for s in args.seeds.split(",")):
        for name, extra in (("student", []), ("student_kd", kd)):
            results.append(train_and_eval(f"{name}_seed{seed}", "resnet18", args.student_epochs,
                                          seed, train_dir, test_dir, args.work_dir, extra))
            print(json.dumps(results[-1]), flush=True)
    write_results(args.work_dir, args.seeds, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
