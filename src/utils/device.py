"""Device and distribution: execution mode, backend, data-parallel setup, collectives on
small values (docs/speed.md#collectives-on-small-values), the all-reduce fusion split."""
import re
from re import Match

import mindspore as ms
import numpy as np

from src.utils.config import ConfigError

MODES = {"GRAPH": ms.GRAPH_MODE, "PYNATIVE": ms.PYNATIVE_MODE}


def setup_device(mode: str, device_target: str, device_id: int = 0, seed: int = 1,
                 run_distribute: bool = False) -> None:
    """Set execution mode (``GRAPH``/``PYNATIVE``), backend, device and global seed;
    ``device_id`` is ignored under ``run_distribute`` (the launcher assigns devices).

    Raises:
        ConfigError: If the installed MindSpore cannot run on ``device_target``.
    """
    check_device_target(device_target)
    ms.set_context(mode=MODES[mode])
    try:
        if device_target == "CPU" or run_distribute:
            # distributed: msrun / the rank table (DEVICE_ID) choose each process's device
            ms.set_device(device_target)
        else:
            ms.set_device(device_target, device_id)
    except RuntimeError as err:
        if "Unsupported device target" not in str(err):
            raise
        raise ConfigError(unsupported_target_message(
            device_target, _SUPPORTED.search(str(err)))) from None
    ms.set_seed(seed)


_SUPPORTED = re.compile(r"only supports one of the \[([^\]]*)\]")
TARGETS = ("CPU", "GPU", "Ascend")


def available_targets() -> list[str] | None:
    """The backends whose plugins loaded at ``import mindspore``, or None if it cannot say."""
    try:
        from mindspore._c_expression import MSContext
        context = MSContext.get_instance()
        return [t for t in TARGETS if context.is_pkg_support_device(t)]
    except (ImportError, AttributeError, RuntimeError):
        return None


def check_device_target(device_target: str) -> None:
    """Raise ConfigError for a ``device_target`` the installed MindSpore does not run on."""
    available = available_targets()
    if available is not None and device_target not in available:
        raise ConfigError(unsupported_target_message(device_target, available))


def unsupported_target_message(device_target: str,
                               available: list[str] | Match[str] | None) -> str:
    """The one line of an unsupported ``device_target``; ``available``: the backends (a list
    or a match of MindSpore's error), or None."""
    if available is not None and not isinstance(available, list):
        available = [t.strip().strip("'\"") for t in available.group(1).split(",")]
    runs_on = f"runs on {', '.join(available)} only" if available else "cannot say what it runs on"
    hint = f"; pass --device_target {available[0]}" if available else ""
    return (f"device_target {device_target} is not available: the installed MindSpore "
            f"{ms.__version__} {runs_on} (a build without {device_target}, or its "
            f"{'CUDA' if device_target == 'GPU' else 'CANN'} libraries do not load){hint}")


def init_distributed(run_distribute: bool, device_num: int) -> tuple[int, int]:
    """Initialize data-parallel training (gradients averaged) when ``run_distribute`` is set.

    Returns (rank id, device count), (0, 1) when not distributed; ``device_num`` 1 takes the
    launcher's count.

    Raises:
        ConfigError: If ``device_num`` is neither 1 nor the launched process count.
    """
    if not run_distribute:
        return 0, 1
    from mindspore.communication import get_group_size, get_rank, init
    init()
    rank, group_size = get_rank(), get_group_size()
    if device_num not in (1, group_size):
        raise ConfigError(f"device_num is {device_num} but the launcher started {group_size} "
                          f"processes: pass --device_num {group_size} (or leave it at 1)")
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL,
                                 gradients_mean=True, device_num=group_size)
    return rank, group_size


def apply_fusion_config(indices: list[int], num_tensors: int, net_name: str) -> list[int]:
    """Set and return the split points of the gradient all-reduce (``all_reduce_fusion_config``);
    empty ``indices``: ``fusion_config_for(num_tensors)``, the trainable tensors.

    Raises:
        ConfigError: If explicit ``indices`` do not fit (``check_fusion_config``).
    """
    indices = list(indices) or fusion_config_for(num_tensors)
    check_fusion_config(indices, num_tensors, net_name)
    if indices:  # none: a single tensor, one group (MindSpore refuses an empty list)
        ms.set_auto_parallel_context(all_reduce_fusion_config=indices)
    return indices


class _SumOverRanks(ms.nn.Cell):
    """All-reduce (sum) over the world group, as a graph (no eager CPU kernel in 2.10)."""

    def __init__(self):
        super().__init__()
        self.all_reduce = ms.ops.AllReduce()

    def construct(self, x):
        return self.all_reduce(x)


_SUM_CELLS = {}  # one compiled all-reduce graph per input shape (compiling one takes ~0.2 s)


def sum_over_ranks(array: np.ndarray) -> np.ndarray:
    """``array`` (float32, any shape, the same on every rank) summed element-wise over the
    ranks by one all-reduce; every rank must call it, in the same order."""
    array = np.ascontiguousarray(array, np.float32)
    if array.shape not in _SUM_CELLS:
        _SUM_CELLS[array.shape] = _SumOverRanks()
    return _SUM_CELLS[array.shape](ms.Tensor(array)).asnumpy()


def all_gather_ints(values: list[int]) -> list[list[int]]:
    """Every rank's ``values`` (ints in [-2**31, 2**31), the same count on every rank), one
    list per rank in rank order, by one all-reduce."""
    from mindspore.communication import get_group_size, get_rank
    slots = np.zeros((get_group_size(), len(values), 2), np.float32)
    slots[get_rank()] = [divmod(int(v) + 2 ** 31, 2 ** 16) for v in values]
    summed = sum_over_ranks(slots).astype(np.int64)
    return [[int(high) * 2 ** 16 + int(low) - 2 ** 31 for high, low in rank] for rank in summed]


def all_gather_int(value: int) -> list[int]:
    """Every rank's ``value`` (an int in [-2**31, 2**31)), in rank order."""
    return [values[0] for values in all_gather_ints([value])]


def all_gather_rows(array: np.ndarray) -> np.ndarray:
    """Every rank's ``array`` (float32 (n_rank, ...), any row count, the same trailing shape on
    every rank) concatenated in rank order, exactly (-0.0 arrives as 0.0), by two all-reduces."""
    from mindspore.communication import get_rank
    counts = all_gather_int(len(array))
    slots = np.zeros((len(counts), max(counts)) + array.shape[1:], np.float32)
    slots[get_rank(), :len(array)] = array
    summed = sum_over_ranks(slots)
    return np.concatenate([summed[rank, :count] for rank, count in enumerate(counts)])


def sum_ints_over_ranks(values: list[int]) -> list[int]:
    """``values`` (ints in [0, 2**31), the same count on every rank) summed exactly over the
    ranks."""
    return [sum(column) for column in zip(*all_gather_ints(values))]


def broadcast_from_rank0(arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Rank 0's floating-point ``arrays`` (the same shapes and dtypes on every rank) on every
    rank, exactly (-0.0 arrives as 0.0), by one all-reduce."""
    from mindspore.communication import get_rank
    if not arrays:
        return []
    flat = np.concatenate([np.ravel(a).astype(np.float32) for a in arrays])
    if get_rank() != 0:
        flat = np.zeros_like(flat)
    summed = sum_over_ranks(flat)
    out, start = [], 0
    for a in arrays:
        out.append(summed[start:start + a.size].reshape(a.shape).astype(a.dtype))
        start += a.size
    return out


def check_fusion_config(indices: list[int], num_tensors: int, net_name: str) -> None:
    """Check that the split points ``indices`` are strictly increasing in
    [1, num_tensors - 1] (``num_tensors``: trainable tensors, ResNet-50 161).

    Raises:
        ConfigError: Naming the valid range and a proportional suggestion.
    """
    suggestion = fusion_config_for(num_tensors)
    valid = all(1 <= i <= num_tensors - 1 for i in indices) and all(
        a < b for a, b in zip(indices, indices[1:]))
    if not valid:
        raise ConfigError(f"all_reduce_fusion_config {indices} does not fit {net_name}: indices "
                         f"must be strictly increasing within [1, {num_tensors - 1}] "
                         f"({num_tensors} trainable tensors); e.g. --all_reduce_fusion_config "
                         f"{','.join(map(str, suggestion))}")


def fusion_config_for(num_tensors: int) -> list[int]:
    """ModelZoo's ResNet-50 split [85, 160] of 161 tensors scaled to ``num_tensors`` (the points
    that fit: [1] for 2 tensors, [] for 1); see docs/distributed.md."""
    points = {round(85 * num_tensors / 161), num_tensors - 1}
    return sorted(i for i in points if 1 <= i <= num_tensors - 1)
