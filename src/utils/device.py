"""Device and distribution: execution mode, backend, data-parallel setup, collectives on
small values, and the all-reduce fusion check."""
import re

import mindspore as ms
import numpy as np

from src.utils.config import ConfigError

MODES = {"GRAPH": ms.GRAPH_MODE, "PYNATIVE": ms.PYNATIVE_MODE}


def setup_device(mode, device_target, device_id=0, seed=1, run_distribute=False):
    """Set execution mode, backend, device and seed.

    Args:
        mode (str): ``GRAPH`` or ``PYNATIVE``.
        device_target (str): ``CPU``, ``GPU`` or ``Ascend``.
        device_id (int): Device index of a single-device run (under ``run_distribute`` the
            launcher assigns devices).
        seed (int): Global seed (``mindspore.set_seed``).
        run_distribute (bool): Data-parallel run.

    Raises:
        ConfigError: If the installed MindSpore cannot run on ``device_target`` (a CPU-only
            build asked for GPU, or the GPU / Ascend libraries do not load): one line naming
            the MindSpore version, the target asked for and those it runs on.
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


def available_targets():
    """The backends the installed MindSpore runs on in this process (the plugins that loaded
    at ``import mindspore``: the CPU-only wheel has no GPU or Ascend plugin; the GPU one needs
    CUDA's libraries), or None when this MindSpore cannot say."""
    try:
        from mindspore._c_expression import MSContext
        context = MSContext.get_instance()
        return [t for t in TARGETS if context.is_pkg_support_device(t)]
    except (ImportError, AttributeError, RuntimeError):
        return None


def check_device_target(device_target):
    """Refuse a ``device_target`` the installed MindSpore does not run on, before MindSpore's
    own multi-line error and log lines.

    Raises:
        ConfigError: As ``setup_device``.
    """
    available = available_targets()
    if available is not None and device_target not in available:
        raise ConfigError(unsupported_target_message(device_target, available))


def unsupported_target_message(device_target, available):
    """The one line of an unsupported ``device_target``; ``available``: the backends (a list
    or a regex match of MindSpore's error), or None."""
    if available is not None and not isinstance(available, list):
        available = [t.strip().strip("'\"") for t in available.group(1).split(",")]
    runs_on = f"runs on {', '.join(available)} only" if available else "cannot say what it runs on"
    hint = f"; pass --device_target {available[0]}" if available else ""
    return (f"device_target {device_target} is not available: the installed MindSpore "
            f"{ms.__version__} {runs_on} (a build without {device_target}, or its "
            f"{'CUDA' if device_target == 'GPU' else 'CANN'} libraries do not load){hint}")


def init_distributed(run_distribute, device_num):
    """Initialize data-parallel training when ``run_distribute`` is set.

    Uses ``mindspore.communication.init()`` (HCCL on Ascend, NCCL on GPU, MindSpore's own
    collectives on CPU; processes started by msrun or a rank table), data-parallel mode with
    gradients averaged over devices. The split of the gradient all-reduce is set once the
    network exists (``apply_fusion_config``).

    Args:
        run_distribute (bool): Data-parallel run.
        device_num (int): Expected device count (1: take the launcher's).

    Returns:
        tuple(int, int): (rank id, number of devices); (0, 1) when not distributed.

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


def apply_fusion_config(indices, num_tensors, net_name):
    """Set the split points of the data-parallel gradient all-reduce
    (``all_reduce_fusion_config`` of MindSpore's auto-parallel context; read when the training
    graph compiles).

    Args:
        indices (list[int]): The configured split points; empty: ``fusion_config_for`` this
            network's trainable tensors.
        num_tensors (int): Tensors that train (``len(net.trainable_params())``: frozen ones
            send no gradient).
        net_name (str): For the message.

    Returns:
        list[int]: The split points set.

    Raises:
        ConfigError: If explicit ``indices`` do not fit (``check_fusion_config``).
    """
    indices = list(indices) or fusion_config_for(num_tensors)
    check_fusion_config(indices, num_tensors, net_name)
    if indices:  # none: a single tensor, one group (MindSpore refuses an empty list)
        ms.set_auto_parallel_context(all_reduce_fusion_config=indices)
    return indices


class _SumOverRanks(ms.nn.Cell):
    """All-reduce (sum) of a tensor over the world group, as a graph (the eager collectives
    have no CPU kernel in MindSpore 2.10)."""

    def __init__(self):
        super().__init__()
        self.all_reduce = ms.ops.AllReduce()

    def construct(self, x):
        return self.all_reduce(x)


_SUM_CELLS = {}  # one compiled all-reduce graph per input shape (compiling one takes ~0.2 s)


def sum_over_ranks(array):
    """``array`` (float32) summed element-wise over every rank of the world group, through one
    all-reduce in a graph compiled once per shape (a call costs about 1.5 ms on CPU for a few
    values). Every rank must call it, in the same order as the other collectives.

    Args:
        array (numpy.ndarray): float32, any shape, the same on every rank.

    Returns:
        numpy.ndarray: float32, the shape of ``array``.
    """
    array = np.ascontiguousarray(array, np.float32)
    if array.shape not in _SUM_CELLS:
        _SUM_CELLS[array.shape] = _SumOverRanks()
    return _SUM_CELLS[array.shape](ms.Tensor(array)).asnumpy()


def all_gather_ints(values):
    """Every rank's ``values`` (a list of ints in [-2**31, 2**31), the same length on every
    rank), in rank order, through one all-reduce over the world group: each rank fills its own
    slots of a zero array. The CPU all-reduce takes only floats, so each value travels as two
    16-bit halves (exact in float32).

    Returns:
        list[list[int]]: one list of values per rank.
    """
    from mindspore.communication import get_group_size, get_rank
    slots = np.zeros((get_group_size(), len(values), 2), np.float32)
    slots[get_rank()] = [divmod(int(v) + 2 ** 31, 2 ** 16) for v in values]
    summed = sum_over_ranks(slots).astype(np.int64)
    return [[int(high) * 2 ** 16 + int(low) - 2 ** 31 for high, low in rank] for rank in summed]


def all_gather_int(value):
    """Every rank's ``value`` (an int in [-2**31, 2**31)), in rank order (``all_gather_ints``).

    Returns:
        list[int]: one value per rank.
    """
    return [values[0] for values in all_gather_ints([value])]


def sum_ints_over_ranks(values):
    """``values`` (a list of ints in [0, 2**31), the same length on every rank) summed over
    the ranks, exactly (``all_gather_ints``: one all-reduce).

    Returns:
        list[int]: the sums, in the order of ``values``.
    """
    return [sum(column) for column in zip(*all_gather_ints(values))]


def broadcast_from_rank0(arrays):
    """Rank 0's ``arrays`` on every rank, through one all-reduce (sum) in which the other ranks
    send zeros: exact, as x + 0 is x in floating point (a -0.0 arrives as 0.0).

    Args:
        arrays (list[numpy.ndarray]): Floating-point arrays; the same shapes and dtypes on
            every rank (the values of ranks other than 0 are not used).

    Returns:
        list[numpy.ndarray]: Rank 0's arrays, each in its own shape and dtype.
    """
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


def check_fusion_config(indices, num_tensors, net_name):
    """Validate ``all_reduce_fusion_config`` against the network's trainable tensors.

    The indices split the gradient all-reduce into fused groups [0, i1), [i1, i2), ...,
    [ik, num_tensors): each must lie in [1, num_tensors - 1], strictly increasing.

    Args:
        indices (list[int]): The configured split points.
        num_tensors (int): ``len(net.trainable_params())`` (ResNet-50: 161).
        net_name (str): For the message.

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


def fusion_config_for(num_tensors):
    """The ResNet-50 split [85, 160] of 161 tensors (ModelZoo's), scaled to ``num_tensors``:
    ResNet-18 [33, 61], ResNet-34 [58, 109], ResNet-101 [166, 313], ResNet-152 [247, 466].
    Few tensors (fine-tuning a few layers: 2 for ``fc`` alone) keep the split points that
    fit: [1] for 2 tensors, [] (one group) for 1."""
    points = {round(85 * num_tensors / 161), num_tensors - 1}
    return sorted(i for i in points if 1 <= i <= num_tensors - 1)
