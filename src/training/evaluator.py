"""The evaluator run at the end of training epochs: top-1/top-5 of the live network (and of its
weight EMA), keeping the checkpoint with the best top-1.
"""
from src.utils.checkpoint import atomic_save_checkpoint


class BestCheckpointEvaluator:
    """Evaluate the network being trained (and its weight EMA) on a dataset and keep the
    checkpoint with the best top-1.

    The best checkpoint holds the weights it was chosen on, under the network's parameter
    names: the live ones, or the EMA's with ``best_on_ema``.

    Args:
        model (mindspore.train.Model): Evaluates the live network (metrics named
            ``top1``/``top5``).
        dataset (mindspore.dataset.Dataset): Eval dataset.
        best_path (str): Where the best checkpoint is written (atomically).
        net (nn.Cell): The network being trained.
        ema (WeightEma, optional): Its weight EMA (``src.training.train_step``).
        ema_model (mindspore.train.Model, optional): Evaluates a second network of the same
            architecture, into which the averages are copied before each evaluation.
        best_on_ema (bool): Choose the best checkpoint by the EMA's top-1.
    """

    def __init__(self, model, dataset, best_path, net, ema=None, ema_model=None,
                 best_on_ema=False):
        self.model, self.dataset, self.best_path, self.net = model, dataset, best_path, net
        self.ema, self.ema_model = ema, ema_model
        self.best_key = "ema_top1" if best_on_ema and ema is not None else "top1"
        self.best_top1 = -1.0

    def evaluate(self, model, prefix=""):
        """{prefix + "top1", prefix + "top5"} of ``model`` on the dataset."""
        result = model.eval(self.dataset, dataset_sink_mode=False)
        return {prefix + "top1": float(result["top1"]), prefix + "top5": float(result["top5"])}

    def __call__(self):
        """Evaluate; save if the chosen top-1 improved. Returns {"top1", "top5"[, "ema_top1",
        "ema_top5"], "best_top1"}."""
        result = self.evaluate(self.model)
        if self.ema is not None:
            averages = self.ema.by_network_name()
            for param in self.ema_model.predict_network.get_parameters():
                param.set_data(averages[param.name].value())
            result.update(self.evaluate(self.ema_model, "ema_"))
        if result[self.best_key] > self.best_top1:
            self.best_top1 = result[self.best_key]
            chosen = (self.ema_model.predict_network if self.best_key == "ema_top1"
                      else self.net)
            atomic_save_checkpoint(chosen, self.best_path)
        return dict(result, best_top1=self.best_top1)
