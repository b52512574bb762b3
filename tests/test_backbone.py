"""The named constructors and their registry, and the backbone form (``features_only``): the
maps' shapes and strides (timm's ``out_indices`` and ``feature_info``), their values equal to
the classifier's, and weights of every source loading into it without the classifier."""
import mindspore as ms
import numpy as np
import pytest
from mindspore.nn.utils import no_init_parameters

from src.models import resnet
from src.models.resnet import NETWORK_REGISTRY, create_network, resnet18, resnet50
from src.utils.architectures import ARCHITECTURES
from src.utils.checkpoint import CheckpointMismatchError, load_into_network, source_names
from tests.alignment_utils import reference_pair
from tests.test_hub import TV_SMALL, add_to_hub_cache, write_weights_folder

# (channels, stride) of the maps 0 (stem after its ReLU) .. 4 (layer4): timm's feature_info
MAPS = {"resnet18": [(64, 2), (64, 4), (128, 8), (256, 16), (512, 32)],
        "resnet50": [(64, 2), (256, 4), (512, 8), (1024, 16), (2048, 32)]}


def shapes(net):
    return [(p.name, tuple(p.shape)) for p in net.get_parameters()]


def images(side=64, batch=2):
    return ms.Tensor(np.random.default_rng(0).standard_normal((batch, 3, side, side)),
                     ms.float32)


# ---- the registry of named constructors ----

def test_registry_holds_the_named_constructors():
    assert NETWORK_REGISTRY["resnet50"] is resnet50 and NETWORK_REGISTRY["resnet18"] is resnet18
    assert list(NETWORK_REGISTRY) == list(ARCHITECTURES)
    for name, constructor in NETWORK_REGISTRY.items():
        assert constructor is getattr(resnet, name)


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_create_network_builds_what_the_constructor_builds(name):
    with no_init_parameters():
        by_name = create_network(name, class_num=10)
        direct = NETWORK_REGISTRY[name](class_num=10)
        default = NETWORK_REGISTRY[name]()
    assert shapes(by_name) == shapes(direct)
    assert type(by_name.layer1[0]) is type(direct.layer1[0])
    assert sum(p.size for p in default.trainable_params()) == ARCHITECTURES[name].params
    assert default.fc.in_channels == ARCHITECTURES[name].num_features
    assert default.fc.out_channels == 1000  # ModelZoo's default class_num


def test_modelzoo_call_takes_class_num_by_position():
    """ModelZoo's ``net = resnet50(class_num)``: the class count is the one positional argument."""
    with no_init_parameters():
        net = resnet50(10)
    assert net.fc.out_channels == 10
    with pytest.raises(TypeError):
        resnet50(10, True)  # the other keywords are keyword-only


def test_create_network_calls_the_registered_object(monkeypatch):
    calls = []
    monkeypatch.setitem(NETWORK_REGISTRY, "resnet50", lambda **kwargs: calls.append(kwargs))
    create_network("resnet50", class_num=3, drop_path_rate=0.1)
    assert len(calls) == 1 and calls[0]["class_num"] == 3 and calls[0]["drop_path_rate"] == 0.1


# ---- features_only: shapes, strides, values ----

@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_feature_maps_shapes_and_strides(name):
    net = create_network(name, features_only=True)
    net.set_train(False)
    maps = net(images(64))
    assert isinstance(maps, tuple) and not hasattr(net, "fc")
    assert [tuple(m.shape) for m in maps] == [(2, c, 64 // s, 64 // s) for c, s in MAPS[name]]
    assert [(f["num_chs"], f["reduction"]) for f in net.feature_info] == MAPS[name]
    assert [f["module"] for f in net.feature_info] == ["relu", "layer1", "layer2", "layer3",
                                                       "layer4"]


def test_out_indices_select_maps_in_graph_mode():
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        net = create_network("resnet18", features_only=True, out_indices=(1, 2, 3, 4))
        net.set_train(False)
        maps = net(images(64))
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    assert [tuple(m.shape[1:]) for m in maps] == [(64, 16, 16), (128, 8, 8), (256, 4, 4),
                                                  (512, 2, 2)]
    assert [f["reduction"] for f in net.feature_info] == [4, 8, 16, 32]
    assert len(create_network("resnet18").feature_info) == 5  # a classifier lists every map


@pytest.mark.parametrize("out_indices", [(), (5,), (-1, 2), 2, (1.0,), (True,), "12", None])
def test_out_indices_outside_0_to_4_are_refused(out_indices):
    """Not a sequence of integers in 0..4 (an int, floats, bools, a string): a ValueError
    naming the argument and the value, not Python's or MindSpore's TypeError."""
    with pytest.raises(ValueError, match="out_indices must be a non-empty subset of") as error:
        create_network("resnet18", features_only=True, out_indices=out_indices)
    assert repr(out_indices) in str(error.value)


def test_unsorted_out_indices_give_the_maps_in_network_order():
    """``out_indices=(3, 1, 3)``: layer1's map (64 channels, stride 4) then layer3's (256,
    stride 16), as the docstring and docs/network.md say, each the map of its stage."""
    net = create_network("resnet18", features_only=True, out_indices=(3, 1, 3))
    net.set_train(False)
    x = images(64)
    maps = net(x)
    assert [tuple(m.shape) for m in maps] == [(2, 64, 16, 16), (2, 256, 4, 4)]
    assert [f["reduction"] for f in net.feature_info] == [4, 16]
    stages = net.stage_maps(x)
    np.testing.assert_array_equal(maps[0].asnumpy(), stages[1].asnumpy())
    np.testing.assert_array_equal(maps[1].asnumpy(), stages[3].asnumpy())


@pytest.mark.parametrize("class_num", ["a", 2.5, True, 0, -3, None])
def test_bad_class_num_named_by_every_constructor(class_num):
    """``resnet50(class_num='a')`` and the like: the ValueError ``class_num=0`` gives, naming
    the argument and the value (before, Python's ``<`` or MindSpore's ``Dense`` TypeError)."""
    for build in (resnet50, lambda class_num: create_network("resnet18", class_num=class_num)):
        with pytest.raises(ValueError, match="class_num must be a positive integer") as error:
            with no_init_parameters():
                build(class_num)
        assert repr(class_num) in str(error.value)


def test_numpy_integer_class_num_and_out_indices_accepted():
    with no_init_parameters():
        net = resnet18(np.int64(3))
        backbone = resnet18(features_only=True, out_indices=[np.int32(4)])
    assert net.fc.out_channels == 3 and backbone.out_indices == (4,)


def test_out_indices_without_features_only_are_refused():
    """A classifier outputs its logits: out_indices other than every map would be ignored."""
    with pytest.raises(ValueError, match=r"out_indices \(1, 2\) is only read with features_only"):
        create_network("resnet18", out_indices=(1, 2))
    create_network("resnet18", out_indices=(4, 3, 2, 1, 0))  # every map: nothing ignored


def test_backbone_maps_are_the_classifiers(tmp_path):
    """The backbone loaded with a classifier's checkpoint: its last map, pooled and put through
    the classifier's fc, gives the classifier's logits; its parameters are the classifier's but
    ``fc``, strictly."""
    classifier = create_network("resnet18", class_num=10)
    ms.save_checkpoint(classifier, str(tmp_path / "r18.ckpt"))
    backbone = create_network("resnet18", features_only=True, out_indices=(4,))
    dropped, _ = load_into_network(backbone, str(tmp_path / "r18.ckpt"))
    assert sorted(dropped) == ["fc.bias", "fc.weight"]
    assert shapes(backbone) == [s for s in shapes(classifier) if not s[0].startswith("fc.")]
    classifier.set_train(False)
    backbone.set_train(False)
    x = images(64)
    (last,) = backbone(x)
    np.testing.assert_allclose(classifier.fc(last.mean((2, 3))).asnumpy(),
                               classifier(x).asnumpy(), rtol=1e-5, atol=1e-5)


def test_backbone_loading_is_strict_for_everything_but_fc(tmp_path):
    ms.save_checkpoint(create_network("resnet34", class_num=10), str(tmp_path / "r34.ckpt"))
    with pytest.raises(CheckpointMismatchError, match="not in network: layer1.2"):
        load_into_network(create_network("resnet18", features_only=True),
                          str(tmp_path / "r34.ckpt"))
    net = create_network("resnet18", class_num=10)
    params = [{"name": p.name, "data": p} for p in net.get_parameters()
              if p.name != "layer2.0.bn1.gamma"]
    ms.save_checkpoint(params, str(tmp_path / "partial.ckpt"))
    with pytest.raises(CheckpointMismatchError, match="missing in checkpoint: layer2.0.bn1.gamma"):
        load_into_network(create_network("resnet18", features_only=True),
                          str(tmp_path / "partial.ckpt"))


def test_mindcv_checkpoint_loads_into_a_backbone(tmp_path):
    net = create_network("resnet18", class_num=10, stem_pool_pad_mode="same")
    names = source_names([p.name for p in net.get_parameters()], "MindCV")
    ms.save_checkpoint([{"name": names[p.name], "data": p} for p in net.get_parameters()],
                       str(tmp_path / "mindcv.ckpt"))
    backbone = create_network("resnet18", features_only=True, stem_pool_pad_mode="same")
    dropped, _ = load_into_network(backbone, str(tmp_path / "mindcv.ckpt"))
    assert sorted(dropped) == ["fc.bias", "fc.weight"]
    np.testing.assert_array_equal(backbone.layer2[0].downsample[0].weight.asnumpy(),
                                  net.layer2[0].downsample[0].weight.asnumpy())


@pytest.fixture(scope="module")
def timm_r18(tmp_path_factory):
    """timm's resnet18 weights (the tests' torch ResNet-18) as a folder and in an offline Hub
    cache, and our classifier holding them."""
    tnet, ours = reference_pair("resnet18", 1000, seed=3)
    root = tmp_path_factory.mktemp("timm_r18")
    folder = write_weights_folder(str(root / "folder"), tnet, "resnet18", TV_SMALL)
    add_to_hub_cache(str(root / "cache"), "timm/resnet18.tv_in1k", folder)
    return folder, root / "cache", ours


def test_safetensors_folder_loads_into_a_backbone(timm_r18):
    folder, _, ours = timm_r18
    backbone = create_network("resnet18", features_only=True)
    dropped, _ = load_into_network(backbone, folder)
    assert sorted(dropped) == ["fc.bias", "fc.weight"]
    want = {p.name: p.asnumpy() for p in ours.get_parameters()}
    for param in backbone.get_parameters():
        np.testing.assert_array_equal(param.asnumpy(), want[param.name], err_msg=param.name)


def test_hub_id_loads_into_a_backbone_offline(timm_r18, monkeypatch):
    from huggingface_hub import constants

    from src.utils import hub

    _, cache, ours = timm_r18
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    hub._download.cache_clear()
    try:
        backbone = create_network("resnet18", features_only=True, out_indices=(2, 3, 4))
        dropped, _ = load_into_network(backbone, "hf-hub:timm/resnet18.tv_in1k")
    finally:
        hub._download.cache_clear()
    assert sorted(dropped) == ["fc.bias", "fc.weight"]
    np.testing.assert_array_equal(backbone.layer4[1].bn2.moving_variance.asnumpy(),
                                  ours.layer4[1].bn2.moving_variance.asnumpy())
