"""MindSpore context setup for the entry points, from a resolved config."""
import mindspore as ms
from mindspore.train import FixedLossScaleManager

MODES = {"GRAPH": ms.GRAPH_MODE, "PYNATIVE": ms.PYNATIVE_MODE}


def setup_device(cfg):
    """Set execution mode, backend, device and seed.

    Args:
        cfg (Config): keys ``mode``, ``device_target``, ``device_id`` (single-device runs;
            under ``run_distribute`` the launcher assigns devices), ``seed``.
    """
    ms.set_context(mode=MODES[cfg.mode])
    if cfg.device_target == "CPU" or cfg.run_distribute:
        # distributed: msrun / the rank table (DEVICE_ID) choose each process's device
        ms.set_device(cfg.device_target)
    else:
        ms.set_device(cfg.device_target, cfg.device_id)
    ms.set_seed(cfg.seed)


def resolve_amp_level(cfg):
    """``amp_level: auto`` -> O2 on GPU/Ascend, O0 (fp32) on CPU; explicit levels pass through.

    On CPU MindSpore's fp16 kernels measured 2-4x slower than fp32 and bf16 fails, so fp32.
    """
    if cfg.amp_level != "auto":
        return cfg.amp_level
    return "O0" if cfg.device_target == "CPU" else "O2"


def init_distributed(cfg):
    """Initialize data-parallel training when ``cfg.run_distribute`` is set.

    Uses ``mindspore.communication.init()`` (HCCL on Ascend, NCCL on GPU, MindSpore's own
    collectives on CPU; processes started by msrun or a rank table), data-parallel mode with
    gradients averaged over devices, and ``all_reduce_fusion_config`` splitting the gradient
    all-reduce.

    Returns:
        tuple(int, int): (rank id, number of devices); (0, 1) when not distributed.

    Raises:
        ValueError: If ``cfg.device_num`` is neither 1 nor the launched process count.
    """
    if not cfg.run_distribute:
        return 0, 1
    from mindspore.communication import get_group_size, get_rank, init
    init()
    rank, group_size = get_rank(), get_group_size()
    if cfg.device_num not in (1, group_size):
        raise ValueError(f"device_num is {cfg.device_num} but the launcher started {group_size} "
                         f"processes: pass --device_num {group_size} (or leave it at 1)")
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL,
                                 gradients_mean=True, device_num=group_size,
                                 all_reduce_fusion_config=cfg.all_reduce_fusion_config)
    return rank, group_size


def check_fusion_config(indices, num_tensors, net_name):
    """Validate ``all_reduce_fusion_config`` against the network's trainable tensors.

    The indices split the gradient all-reduce into fused groups [0, i1), [i1, i2), ...,
    [ik, num_tensors): each must lie in [1, num_tensors - 1], strictly increasing.

    Args:
        indices (list[int]): The configured split points.
        num_tensors (int): ``len(net.trainable_params())`` (ResNet-50: 161).
        net_name (str): For the message.

    Raises:
        ValueError: Naming the valid range and a proportional suggestion.
    """
    suggestion = fusion_config_for(num_tensors)
    valid = all(1 <= i <= num_tensors - 1 for i in indices) and all(
        a < b for a, b in zip(indices, indices[1:]))
    if not valid:
        raise ValueError(f"all_reduce_fusion_config {indices} does not fit {net_name}: indices "
                         f"must be strictly increasing within [1, {num_tensors - 1}] "
                         f"({num_tensors} trainable tensors); e.g. --all_reduce_fusion_config "
                         f"{','.join(map(str, suggestion))}")


def fusion_config_for(num_tensors):
    """The ResNet-50 split [85, 160] of 161 tensors, scaled to ``num_tensors``."""
    return [round(85 * num_tensors / 161), num_tensors - 1]


def loss_scale_setup(cfg, amp_level):
    """(loss-scale manager for ``Model``, loss scale for the optimizer) under ``amp_level``.

    fp32 (O0): no loss scaling. GPU/Ascend: a fixed scale whose overflowed steps are skipped
    (MindSpore's loss-scale cell checks the gradients and drops the update). CPU with mixed
    precision: MindSpore supports only a fixed scale without overflow detection there, so the
    optimizer divides it out and a non-finite loss stops training instead.
    """
    if amp_level == "O0":
        return None, 1.0
    if cfg.device_target == "CPU":
        return FixedLossScaleManager(cfg.loss_scale, drop_overflow_update=False), cfg.loss_scale
    return FixedLossScaleManager(cfg.loss_scale, drop_overflow_update=True), 1.0
