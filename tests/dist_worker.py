"""Worker of the data-parallel tests: K training steps of ResNet-18 with frozen BatchNorm on
real CIFAR-10 images, then the parameters saved as .npz.

    msrun --worker_num 2 ... tests/dist_worker.py --out DIR     # rank r trains on its half
    python tests/dist_worker.py --out DIR --single              # one process, whole batch

Global batch = 2 x per-rank batch; rank r takes rows [r*B, (r+1)*B) of every global batch,
so the averaged gradient of the two ranks is the single process's gradient.
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from src.env import set_cpu_fast_path  # noqa: E402

set_cpu_fast_path()

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402

from src.deploy.inference import preprocess_images  # noqa: E402
from src.models.resnet import create_network  # noqa: E402
from src.training.loss import CrossEntropySmooth  # noqa: E402
from src.training.optimizer import create_optimizer  # noqa: E402
from tests.helpers import interleaved_class_images  # noqa: E402


def real_batches(data_path, steps, global_batch):
    paths, labels = interleaved_class_images(data_path, steps * global_batch)
    return preprocess_images(paths, 32, 32), labels


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--data_path", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8, help="per-rank batch")
    parser.add_argument("--single", action="store_true")
    args = parser.parse_args()

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    rank, size = 0, 1
    if not args.single:
        from mindspore.communication import get_group_size, get_rank, init
        init()
        rank, size = get_rank(), get_group_size()
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL,
                                     gradients_mean=True, all_reduce_fusion_config=[33, 61])
    ms.set_seed(1)  # same initial weights on every rank
    net = create_network("resnet18", 10)
    for _, cell in net.cells_and_names():
        if isinstance(cell, ms.nn.BatchNorm2d):
            cell.use_batch_statistics = False  # BN-free state: no per-rank statistics
    step = ms.nn.TrainOneStepCell(ms.nn.WithLossCell(net, CrossEntropySmooth(0.1, 10)),
                                  create_optimizer(net, 0.05, 0.875, 1 / 32768))
    step.set_train(True)
    global_batch = 2 * args.batch
    images, labels = real_batches(args.data_path, args.steps, global_batch)
    rows = slice(0, global_batch) if args.single else slice(rank * args.batch,
                                                            (rank + 1) * args.batch)
    for s in range(args.steps):
        x = images[s * global_batch:(s + 1) * global_batch][rows]
        y = labels[s * global_batch:(s + 1) * global_batch][rows]
        step(ms.Tensor(x), ms.Tensor(y))
    name = "single" if args.single else f"rank{rank}_of{size}"
    np.savez(os.path.join(args.out, f"{name}.npz"),
             **{p.name: p.asnumpy() for p in net.trainable_params()})


if __name__ == "__main__":
    main()
