"""Upper limits of config values, shared by the checks (``src.utils.config``) and the
configuration reference (``tools/gen_config_docs.py``)."""

INT32_MAX = 2 ** 31 - 1  # every integer: MindSpore's counters and op attributes are int32
FLOAT32_MAX = 3.4028234663852886e+38  # every float, in magnitude: values reach the net as float32
SEED_MAX = 2 ** 32 - 1  # MindSpore's seed range
DEVICE_ID_MAX = 4095  # MindSpore's device_id range
CLASS_NUM_MAX = 2 ** 20  # the ResNet-50 classifier alone is then 8 GiB
BATCH_SIZE_MAX = 2 ** 16  # images per device per step
IMAGE_SIDE_MAX = 4096  # pixels per side of a training or eval image
AUG_REPEATS_MAX = 64  # copies of each image per epoch (aug_repeats)
MAX_TRAINABLE_LAYERS = 5  # stages that can train: conv1 (with bn1) and layer1 .. layer4
MAGNITUDE_BINS = 31  # TrivialAugment / RandAugment magnitude bins (torchvision's)
RANDAUGMENT_MAX_OPS = 3  # its one random choice over op tuples has 28 ** num_ops entries
RANDAUGMENT_MAX_MAGNITUDE = MAGNITUDE_BINS - 1  # a bin index
CAM_IMAGES_MAX = 10000  # Grad-CAM overlays eval.py writes (about 0.1 MB each at 224 px)
