"""Image preprocessing values shared by the pipelines (``src.data``), the config checks and
the Hub reader (``src.utils``): one home each, in ``src.utils`` because it imports no other
package of ``src``. The limits of config values are in ``src.utils.limits``."""
INTERPOLATIONS = ("bilinear", "bicubic")  # eval resize filters, PIL's (torchvision's, timm's)
IMAGENET_MEAN = (0.485, 0.456, 0.406)  # RGB, for pixels in [0, 1]
IMAGENET_STD = (0.229, 0.224, 0.225)
