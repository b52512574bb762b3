"""Test-only launcher of train.py under msrun: runs the script as ``__main__`` and prints
``rank R exit status S`` (R msrun's ``RANK_ID``) when it exits, before msrun, which ends the
other workers as soon as one exits with a non-zero status, can hide the statuses. With
``--nan_rank R --nan_batch N`` it makes rank R's loss non-finite: the soft targets (the
``label`` column of a run with mixup, float32) of that rank's N-th training batch (1-based,
counted over the process) are multiplied by NaN before they reach the loss, so that rank
alone computes a NaN loss at that step; the other ranks read their data untouched. (NaN
images would not do: on CPU the first ReLU turns NaN into 0, the loss stays finite and only
the gradients of the stem carry the NaN.)
With ``--save_params DIR`` every rank writes the training cell's parameters (student,
optimizer state, a distillation teacher's) after ``Model.train`` returns to
``DIR/rank{R}.npz``: train.py saves checkpoints on rank 0 alone.

    msrun ... tests/rank_fault.py [--nan_rank 1 --nan_batch 3] [--save_params DIR] train.py ARGS...

The product has no such hook: the data of the ranks comes from one shared folder, so a
fault on one rank alone cannot be made by real data.
"""
import argparse
import os
import runpy
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import src.env  # noqa: E402,F401  first, as train.py: the oneDNN default before MindSpore


def poison_batch(rank, batch):
    """On rank ``rank``: wrap ``Model.train`` so that its dataset's ``batch``-th batch (1-based,
    counted over all calls) holds NaN soft targets."""
    import numpy as np
    from mindspore.train import Model

    if int(os.environ.get("RANK_ID", "-1")) != rank:
        return
    seen, lock = [0], threading.Lock()

    def targets(soft_targets):
        with lock:
            seen[0] += 1
            poisoned = seen[0] == batch
        return soft_targets * np.float32("nan") if poisoned else soft_targets

    train = Model.train

    def train_with_a_nan_batch(self, epoch, train_dataset, *args, **kwargs):
        dataset = train_dataset.map(operations=targets, input_columns="label",
                                    num_parallel_workers=1)
        return train(self, epoch, dataset, *args, **kwargs)

    Model.train = train_with_a_nan_batch


def save_parameters(folder):
    """Wrap ``Model.train`` so that, when it returns, this rank's training cell's parameters
    (by name, as numpy arrays) go to ``folder/rank{RANK_ID}.npz``."""
    import numpy as np
    from mindspore.train import Model

    train = Model.train

    def train_and_save(self, *args, **kwargs):
        result = train(self, *args, **kwargs)
        os.makedirs(folder, exist_ok=True)
        np.savez(os.path.join(folder, f"rank{os.environ.get('RANK_ID')}.npz"),
                 **{p.name: p.asnumpy() for p in self._train_network.get_parameters()})
        return result

    Model.train = train_and_save


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--nan_rank", type=int, default=-1)
    parser.add_argument("--nan_batch", type=int, default=0)
    parser.add_argument("--save_params", default="")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    poison_batch(args.nan_rank, args.nan_batch)
    if args.save_params:
        save_parameters(args.save_params)
    sys.argv = [args.script, *args.args]
    try:
        runpy.run_path(args.script, run_name="__main__")
    except SystemExit as done:  # train.py always ends so (src.utils.cli.run_entry_point)
        print(f"rank {os.environ.get('RANK_ID')} exit status {done.code}", flush=True)
        raise


if __name__ == "__main__":
    main()
