"""Device and distribution: execution mode, backend, data-parallel setup, collectives on
small values, and the all-reduce fusion check."""
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
    """
    ms.set_context(mode=MODES[mode])
    if device_target == "CPU" or run_distribute:
        # distributed: msrun / the rank table (DEVICE_ID) choose each process's device
        ms.set_device(device_target)
    else:
        ms.set_device(device_target, device_id)
    ms.set_seed(seed)


def init_distributed(run_distribute, device_num, all_reduce_fusion_config):
    """Initialize data-parallel training when ``run_distribute`` is set.

    Uses ``mindspore.communication.init()`` (HCCL on Ascend, NCCL on GPU, MindSpore's own
    collectives on CPU; processes started by msrun or a rank table), data-parallel mode with
    gradients averaged over devices, and ``all_reduce_fusion_config`` splitting the gradient
    all-reduce.

    Args:
        run_distribute (bool): Data-parallel run.
        device_num (int): Expected device count (1: take the launcher's).
        all_reduce_fusion_config (list[int]): Split points of the gradient all-reduce.

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
                                 gradients_mean=True, device_num=group_size,
                                 all_reduce_fusion_config=all_reduce_fusion_config)
    return rank, group_size


class _SumOverRanks(ms.nn.Cell):
    """All-reduce (sum) of a tensor over the world group, as a graph (the eager collectives
    have no CPU kernel in MindSpore 2.10)."""

    def __init__(self):
        super().__init__()
        self.all_reduce = ms.ops.AllReduce()

    def construct(self, x):
        return self.all_reduce(x)


def all_gather_int(value):
    """Every rank's ``value`` (an int in [-2**31, 2**31)), in rank order, through one
    all-reduce over the world group: each rank fills its own slots of a zero vector. The CPU
    all-reduce takes only floats, so the value travels as two 16-bit halves (exact in float32).

    Returns:
        list[int]: one value per rank.
    """
    from mindspore.communication import get_group_size, get_rank
    slots = np.zeros((get_group_size(), 2), np.float32)
    slots[get_rank()] = divmod(int(value) + 2 ** 31, 2 ** 16)
    summed = _SumOverRanks()(ms.Tensor(slots)).asnumpy().astype(np.int64)
    return [int(high) * 2 ** 16 + int(low) - 2 ** 31 for high, low in summed]


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
    """The ResNet-50 split [85, 160] of 161 tensors, scaled to ``num_tensors``."""
    return [round(85 * num_tensors / 161), num_tensors - 1]
