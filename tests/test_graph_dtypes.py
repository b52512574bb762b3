"""No training graph holds a float64 operation: Ascend's AI Core has no float64.

Checked on the compiled graphs, not on the source: a fresh interpreter (graph saving is
process-wide) compiles and runs the training cell of each optimizer on CPU with MindSpore's
IR dump on (``MS_DEV_SAVE_GRAPHS=1``, ``MS_DEV_SAVE_GRAPHS_PATH``; MindSpore 2.10 deprecates
``set_context(save_graphs=...)`` in their favour), and every saved ``.ir`` file, from type
inference to the CPU kernel graphs, is searched for a float64 type.

The training cell is the project's ``TrainStep`` (gradient accumulation over 2 micro-batches,
global-norm clipping, EMA with warmup) over a small Conv-BN-ReLU-Pool-Dense network, with
``create_optimizer``'s optimizer and a per-step LR array, compiled in GRAPH mode; then the same
optimizer type with a constant LR is called alone in PyNative mode (its ``construct`` is
``ms.jit``-compiled). One fresh interpreter compiles all four optimizers in turn, the files
of each moved into its own folder before the next. Run ``python -m tests.test_graph_dtypes
adamw`` with the two variables set to look at the graphs (in ``<path>/adamw``).
"""
import os
import re
import subprocess
import sys
from collections import Counter

import pytest

import src.env  # noqa: F401  (oneDNN's ISA cap before MindSpore loads, also as __main__)
from src.training.optimizer import OPTIMIZERS
from tests.helpers import ROOT

# A float64 type as the IR prints it: Tensor[Float64], dtype=Float64, Float64xDefaultFormat
# (kernel graphs), F64 (scalar immediates); "double" is how C++ names it.
FLOAT64 = re.compile(r"float64|\bf64\b|\bfp64\b|\bdouble\b", re.IGNORECASE)
# what each alternative of FLOAT64 contains, lower-cased: a text without any holds no match
FLOAT64_WORDS = ("float64", "f64", "fp64", "double")
SOURCE = re.compile(r"#\s*In file (.*)")


def train_one_step(optimizer):
    """The graph-dumping side (run in a fresh interpreter): one ``TrainStep`` step in GRAPH
    mode with ``optimizer`` and an LR per step, then one PyNative call of that optimizer type
    (constant LR) on its own. CPU."""
    import mindspore as ms
    import mindspore.nn as nn
    import numpy as np

    from src.training.loss import create_loss
    from src.training.optimizer import create_optimizer
    from src.training.train_step import TrainStep, WeightEma

    def network():
        return nn.SequentialCell([nn.Conv2d(3, 4, 3, pad_mode="valid", has_bias=True),
                                  nn.BatchNorm2d(4), nn.ReLU(), nn.AvgPool2d(6), nn.Flatten(),
                                  nn.Dense(4, 10)])

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    rng = np.random.default_rng(0)
    images = ms.Tensor(rng.standard_normal((4, 3, 8, 8)).astype(np.float32))
    labels = ms.Tensor(np.array([0, 3, 7, 9], np.int32))
    net = network()
    lrs = np.linspace(0.1, 0.01, 10).astype(np.float32)
    opt = create_optimizer(net, lrs, optimizer=optimizer, weight_decay=1e-4)
    step = TrainStep(nn.WithLossCell(net, create_loss("ce", 0.1, 10)), opt, grad_clip_norm=1.0,
                     accumulation_steps=2, ema=WeightEma(net, 0.9, warmup=True))
    step.set_train()
    for part in (slice(0, 2), slice(2, 4)):  # 2 micro-batches: the second steps the optimizer
        loss = float(step(images[part], labels[part]).asnumpy())
        assert np.isfinite(loss), loss

    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = network()
    opt = create_optimizer(net, 0.1, optimizer=optimizer, weight_decay=1e-4)
    opt(tuple(ms.Tensor(np.ones(p.shape, np.float32)) for p in net.trainable_params()))


def project_source(lines, i):
    """The innermost project line (not MindSpore's own) of the source stack the IR prints in
    the comment lines below line ``i`` (a node and its types), or "?". A hint for the failure
    message only: MindSpore may give a node the debug information of a similar one (e.g. the
    optimizer's Pow named after the EMA's)."""
    where = "?"
    for line in lines[i + 1:i + 40]:
        stripped = line.strip()
        if not stripped.startswith(("#", ":")):
            break
        match = SOURCE.search(stripped)
        if match and match.group(1).startswith(ROOT) and "site-packages" not in match.group(1):
            where = os.path.relpath(match.group(1), ROOT).strip()
    return where


def float64_lines(folder):
    """Lines of the ``.ir`` files under ``folder`` that name a float64 type.

    The files are searched as bytes (~70 MB per optimizer; ``bytes.lower`` folds ASCII only,
    which is all the words hold); a file is decoded and searched line by line only when it
    holds one of ``FLOAT64_WORDS``.

    Returns:
        tuple(list[tuple[str, str]], int, bytes): (``file: line``, the project source line
        that made the node, see ``project_source``) per offending line, the number of ``.ir``
        files read, and their concatenated contents (UTF-8).
    """
    found, count, contents = [], 0, []
    for root, _, files in os.walk(folder):
        for name in sorted(files):
            if not name.endswith(".ir"):
                continue
            count += 1
            with open(os.path.join(root, name), "rb") as f:
                contents.append(f.read())
            folded = contents[-1].lower()
            if not any(word.encode() in folded for word in FLOAT64_WORDS):
                continue  # no line can match: the line by line search below is skipped
            text = contents[-1].decode("utf-8", errors="replace")
            lowered, lines = text.lower(), text.splitlines()
            # every FLOAT64 match holds "64" or "double" (any case): the regex, slow on
            # ~70 MB of IR per optimizer, runs on the lines that hold one of them
            for i, low in enumerate(lowered.splitlines()):
                if ("64" in low or "double" in low) and FLOAT64.search(lines[i]) \
                        and not SOURCE.search(lines[i]):
                    found.append((f"{name}: {lines[i].strip()[:150]}",
                                  project_source(lines, i)))
    return found, count, b"\n".join(contents)


def dump_each(optimizers, folder):
    """The graph-dumping side for several optimizers in one interpreter (its imports paid
    once): ``train_one_step`` of each, then the files saved so far moved into
    ``folder/<optimizer>``, so each optimizer's folder holds the graphs compiled for it."""
    for optimizer in optimizers:
        train_one_step(optimizer)
        os.makedirs(os.path.join(folder, optimizer))
        for name in os.listdir(folder):
            if name not in optimizers:
                os.rename(os.path.join(folder, name), os.path.join(folder, optimizer, name))


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    """The IR saved for each optimizer (one fresh interpreter for all four): the
    ``dump_each`` folder and the process's result."""
    dump = tmp_path_factory.mktemp("ir")
    env = dict(os.environ, MS_DEV_SAVE_GRAPHS="1", MS_DEV_SAVE_GRAPHS_PATH=str(dump))
    result = subprocess.run([sys.executable, "-m", "tests.test_graph_dtypes",
                             *sorted(OPTIMIZERS)], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=600, check=False)
    return dump, result


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_training_graphs_hold_no_float64(optimizer, graphs):
    """Momentum, AdamW, LAMB and LARS: the saved IR of the compiled training step (and of the
    PyNative-compiled optimizer) holds the optimizer's operators and no float64 type."""
    folder, result = graphs
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    dump = folder / optimizer
    found, files, text = float64_lines(dump)
    assert files >= 10, f"only {files} .ir files saved under {dump}: is graph saving on?"
    scope = {"momentum": "optimizer-Momentum", "adamw": "optimizer-AdamW",
             "lamb": "optimizer-Lamb", "lars": "optimizer-Lars"}[optimizer]
    assert scope.encode() in text, f"the saved graphs do not contain {scope}'s operators"
    assert b"Float32" in text  # the search reads the type names the IR prints
    sources = Counter(where for _, where in found)
    assert not found, (f"{len(found)} float64 line(s) in the {optimizer} training graphs; "
                       "from:\n" + "\n".join(f"{n:5d} x {w}" for w, n in sources.most_common(8))
                       + "\ne.g.:\n" + "\n".join(line for line, _ in found[:4]))


if __name__ == "__main__":
    dump_each(sys.argv[1:], os.environ["MS_DEV_SAVE_GRAPHS_PATH"])
