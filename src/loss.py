"""Label-smoothing cross-entropy, PyTorch convention."""
import mindspore as ms
import mindspore.nn as nn
import mindspore.ops as ops


class CrossEntropySmooth(nn.LossBase):
    """Softmax cross-entropy against smoothed one-hot targets.

    Target = (1 - eps) * onehot + eps / K, as ``torch.nn.CrossEntropyLoss(label_smoothing=eps)``
    and Szegedy et al., "Rethinking the Inception Architecture" (2016). ModelZoo's
    ResNet spreads eps / (K - 1) over the wrong classes instead, which differs.

    Args:
        smooth_factor (float): eps in [0, 1). 0 gives plain softmax cross-entropy.
        class_num (int): K, the number of classes.
        reduction (str): ``mean`` (over the batch), ``sum`` or ``none``.

    Inputs:
        - **logits** (Tensor) - float32 or float16, shape (N, K).
        - **label** (Tensor) - int32, shape (N,), class indices in [0, K).

    Outputs:
        float32 Tensor: scalar for ``mean``/``sum``, shape (N,) for ``none``.

    Raises:
        ValueError: If ``smooth_factor`` is outside [0, 1) or ``class_num`` < 1.
    """

    def __init__(self, smooth_factor=0.1, class_num=1000, reduction="mean"):
        super().__init__(reduction)
        if not 0.0 <= smooth_factor < 1.0:
            raise ValueError(f"smooth_factor (label_smoothing) must be in [0, 1), "
                             f"got {smooth_factor}")
        if class_num < 1:
            raise ValueError(f"class_num must be positive, got {class_num}")
        self.class_num = class_num
        self.on_value = ms.Tensor(1.0 - smooth_factor + smooth_factor / class_num, ms.float32)
        self.off_value = ms.Tensor(smooth_factor / class_num, ms.float32)
        self.log_softmax = nn.LogSoftmax(axis=-1)

    def construct(self, logits, label):
        target = ops.one_hot(label, self.class_num, self.on_value, self.off_value)
        per_sample = -(target * self.log_softmax(logits.astype(ms.float32))).sum(axis=-1)
        return self.get_loss(per_sample)
