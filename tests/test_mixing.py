"""BatchMixer against the definitions of timm's batch Mixup / CutMix (not against itself).

Images that are a distinct constant per sample make every output pixel tell where it came
from; lam is read back from the targets (sample and partner of different classes), so the
pixel counts, the blend and the lam distribution are checked against the formulas.
"""
import mindspore.dataset as ds
import numpy as np
import pytest

from src.data.mixing import BatchMixer

N, C, H, W, K = 6, 3, 12, 20, 10  # H != W catches a swapped box; N even: no self-paired sample


class Info:
    """Stands in for mindspore.dataset.BatchInfo (which cannot be built from Python)."""

    def __init__(self, batch_num, epoch_num=0):
        self.batch_num, self.epoch_num = batch_num, epoch_num

    def get_batch_num(self):
        return self.batch_num

    def get_epoch_num(self):
        return self.epoch_num


def constant_batch(n=N):
    """Image i is the constant i + 1 everywhere; label i (all distinct, partners differ)."""
    images = np.broadcast_to(np.arange(1, n + 1, dtype=np.float32)[:, None, None, None],
                             (n, C, H, W)).copy()
    return images, np.arange(n, dtype=np.int32)


def smooth_onehot(labels, k, eps):
    """Definition: (1 - eps) * onehot + eps / K, i.e. off = eps / K, on = 1 - eps + eps / K."""
    return (1.0 - eps) * np.eye(k)[labels] + eps / k


def lam_from_targets(targets, labels, eps, k=K, row=0):
    """target[i, y_i] = lam * on + (1 - lam) * off when y_i differs from the partner's label."""
    off, on = eps / k, 1.0 - eps + eps / k
    return (float(targets[row, labels[row]]) - off) / (on - off)


def mixer(**kw):
    args = dict(mixup_alpha=0.0, cutmix_alpha=0.0, label_smoothing=0.1, class_num=K, seed=7)
    args.update(kw)
    return BatchMixer(**args)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("alphas", [(0.8, 0.0), (0.0, 1.0), (0.2, 1.0)])
def test_target_rows_sum_to_one_and_shapes(eps, alphas):
    m = mixer(mixup_alpha=alphas[0], cutmix_alpha=alphas[1], label_smoothing=eps)
    rng = np.random.default_rng(0)
    for b in range(30):
        images = rng.standard_normal((N, C, H, W)).astype(np.float32)
        labels = rng.integers(0, K, N).astype(np.int32)
        out, targets = m(images, labels, Info(b))
        assert out.dtype == np.float32 and out.shape == (N, C, H, W)
        assert targets.dtype == np.float32 and targets.shape == (N, K)
        np.testing.assert_allclose(targets.sum(axis=1), 1.0, atol=1e-6)
        assert targets.min() >= 0.0


def test_cutmix_box_is_one_rectangle_from_the_reversed_partner_with_corrected_lam():
    eps = 0.1
    m = mixer(cutmix_alpha=1.0, label_smoothing=eps)
    images, labels = constant_batch()
    pasted_any = interior = 0
    for b in range(150):
        out, targets = m(images, labels, Info(b))
        boxes = []
        for i in range(N):
            own, partner = float(i + 1), float(N - i)  # partner is sample N-1-i (x.flip(0))
            assert np.all((out[i] == own) | (out[i] == partner)), "pixels from a third image"
            mask = out[i] == partner
            assert np.all(mask == mask[0]), "box differs between channels"
            mask = mask[0]
            lam = lam_from_targets(targets, labels, eps, row=i)
            # corrected lam: pixels pasted = (1 - lam) * H * W, exactly (up to float32 targets)
            assert mask.sum() == pytest.approx((1.0 - lam) * H * W, abs=1e-3)
            rows, cols = np.nonzero(mask.any(axis=1))[0], np.nonzero(mask.any(axis=0))[0]
            box = (rows.min(), rows.max() + 1, cols.min(), cols.max() + 1) if mask.any() else None
            if box is not None:  # one filled axis-aligned rectangle
                assert mask.sum() == (box[1] - box[0]) * (box[3] - box[2])
            boxes.append(box)
        assert len(set(boxes)) == 1, "one box for the whole batch"
        box = boxes[0]
        if box is None:
            continue
        pasted_any += 1
        # timm's rand_bbox: half sides int(side * sqrt(1 - lam_raw)) // 2 about the centre, so an
        # unclipped box is 2 * (int(H * r) // 2) by 2 * (int(W * r) // 2), r = sqrt(1 - lam_raw)
        _, lam_raw, use_cutmix = m.draw(b)
        assert use_cutmix
        r = np.sqrt(1.0 - lam_raw)
        full_h, full_w = 2 * (int(H * r) // 2), 2 * (int(W * r) // 2)
        h, w = box[1] - box[0], box[3] - box[2]
        assert h <= full_h and w <= full_w
        if 0 < box[0] and box[1] < H and 0 < box[2] and box[3] < W:
            interior += 1
            assert (h, w) == (full_h, full_w)
    assert pasted_any > 100 and interior > 5


def test_mixup_is_lam_x_plus_one_minus_lam_reversed_batch():
    eps = 0.1
    m = mixer(mixup_alpha=0.4, label_smoothing=eps)
    rng = np.random.default_rng(3)
    lams = []
    for b in range(40):
        images = rng.standard_normal((N, C, H, W)).astype(np.float32)
        labels = np.arange(N, dtype=np.int32)
        keep = images.copy()
        out, targets = m(images, labels, Info(b))
        np.testing.assert_array_equal(images, keep)  # the input is not modified
        lam = lam_from_targets(targets, labels, eps)
        lams.append(lam)
        np.testing.assert_allclose(out, lam * images + (1.0 - lam) * images[::-1], atol=2e-6)
        want = lam * smooth_onehot(labels, K, eps) + (1 - lam) * smooth_onehot(labels[::-1], K, eps)
        np.testing.assert_allclose(targets, want, atol=1e-6)
    assert 0.0 < min(lams) and max(lams) < 1.0 and len(set(np.round(lams, 6))) == len(lams)


@pytest.mark.parametrize("eps", [0.0, 0.2])
def test_mix_prob_zero_leaves_images_and_gives_smoothed_one_hot(eps):
    m = mixer(mixup_alpha=1.0, cutmix_alpha=1.0, mix_prob=0.0, label_smoothing=eps)
    rng = np.random.default_rng(4)
    for b in range(20):
        images = rng.standard_normal((N, C, H, W)).astype(np.float32)
        labels = rng.integers(0, K, N).astype(np.int32)
        out, targets = m(images, labels, Info(b))
        np.testing.assert_array_equal(out, images)
        np.testing.assert_allclose(targets, smooth_onehot(labels, K, eps), atol=1e-7)


def kind_of(out, images):
    """'none', 'cutmix' (every pixel from self or partner) or 'mixup' (blended values)."""
    if np.array_equal(out, images):
        return "none"
    return "cutmix" if np.all((out == images) | (out == images[::-1])) else "mixup"


def test_share_of_cutmix_follows_mix_switch_prob():
    images, labels = constant_batch()
    for p in (0.3, 0.5):
        m = mixer(mixup_alpha=0.8, cutmix_alpha=1.0, mix_switch_prob=p)
        kinds = [kind_of(m(images, labels, Info(b))[0], images) for b in range(400)]
        assert kinds.count("none") <= 20  # only cutmix boxes of area 0 (lam > 1 - (2/H)^2)
        share = (kinds.count("cutmix") + kinds.count("none")) / 400
        assert share == pytest.approx(p, abs=0.07)  # 3 sigma at n = 400


def test_share_of_mixed_batches_follows_mix_prob():
    images, labels = constant_batch()
    m = mixer(mixup_alpha=0.8, mix_prob=0.6)
    kinds = [kind_of(m(images, labels, Info(b))[0], images) for b in range(400)]
    assert set(kinds) == {"none", "mixup"}
    assert kinds.count("mixup") / 400 == pytest.approx(0.6, abs=0.075)


@pytest.mark.parametrize("alpha", [0.4, 2.0])
def test_mixup_lam_is_beta_alpha_alpha(alpha):
    scipy_stats = pytest.importorskip("scipy.stats")
    eps = 0.1
    m = mixer(mixup_alpha=alpha, label_smoothing=eps)
    images, labels = constant_batch(2)
    lams = np.array([lam_from_targets(m(images, labels, Info(b))[1], labels, eps)
                     for b in range(2000)])
    var = 1.0 / (4.0 * (2.0 * alpha + 1.0))  # Beta(a, a): mean 1/2, variance 1 / (4 (2a + 1))
    assert lams.mean() == pytest.approx(0.5, abs=4 * np.sqrt(var / 2000))
    assert lams.var() == pytest.approx(var, rel=0.1)
    assert scipy_stats.kstest(lams, scipy_stats.beta(alpha, alpha).cdf).pvalue > 1e-3


def test_same_seed_and_batch_give_identical_output_regardless_of_global_state():
    images, labels = constant_batch()
    images = images + np.random.default_rng(5).standard_normal(images.shape).astype(np.float32)
    kw = dict(mixup_alpha=0.8, cutmix_alpha=1.0, mix_prob=0.9)
    first = [mixer(**kw)(images, labels, Info(b)) for b in range(12)]
    np.random.seed(123)
    np.random.random(17)  # global state must not matter, nor the call order
    again = [mixer(**kw)(images, labels, Info(b)) for b in reversed(range(12))][::-1]
    for (x1, t1), (x2, t2) in zip(first, again):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(t1, t2)
    differ = [not np.array_equal(first[b][1], first[b + 1][1]) for b in range(11)]
    assert all(differ), "consecutive batch numbers gave the same draw"
    other_seed = mixer(seed=8, **kw)(images, labels, Info(0))
    other_epoch = mixer(**kw)(images, labels, Info(0, epoch_num=1))
    assert not np.array_equal(other_seed[1], first[0][1])
    assert not np.array_equal(other_epoch[1], first[0][1])


def pipeline(mixer_, images, labels, skip=0):
    data = ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=False)
    data = data.batch(4, drop_remainder=True, per_batch_map=mixer_, num_parallel_workers=2,
                      input_columns=["image", "label"], output_columns=["image", "label"])
    if skip:
        data = data.skip(skip)
    return [(r["image"], r["label"])
            for r in data.create_dict_iterator(output_numpy=True, num_epochs=1)]


def test_real_pipeline_skip_gives_the_same_later_batches():
    rng = np.random.default_rng(6)
    images = rng.standard_normal((24, C, 8, 8)).astype(np.float32)
    labels = rng.integers(0, K, 24).astype(np.int32)
    m = mixer(mixup_alpha=0.8, cutmix_alpha=1.0)
    full = pipeline(m, images, labels)
    skipped = pipeline(m, images, labels, skip=2)
    assert len(full) == 6 and len(skipped) == 4
    for (x1, t1), (x2, t2) in zip(full[2:], skipped):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(t1, t2)
    for b, (x, t) in enumerate(full):  # batch b of the pipeline is the mix of batch number b
        assert x.dtype == np.float32 and x.shape == (4, C, 8, 8)
        assert t.dtype == np.float32 and t.shape == (4, K)
        want_x, want_t = m.mix(images[4 * b:4 * b + 4], labels[4 * b:4 * b + 4], b)
        np.testing.assert_array_equal(x, want_x)
        np.testing.assert_array_equal(t, want_t)


@pytest.mark.parametrize("kw, name", [
    (dict(mixup_alpha=-0.1), "mixup_alpha"),
    (dict(cutmix_alpha=-1.0), "cutmix_alpha"),
    (dict(mixup_alpha=0.0, cutmix_alpha=0.0), "mixup_alpha"),
    (dict(mix_prob=1.5), "mix_prob"),
    (dict(mix_prob=-0.1), "mix_prob"),
    (dict(mix_switch_prob=1.01), "mix_switch_prob"),
    (dict(label_smoothing=1.0), "label_smoothing"),
    (dict(class_num=0), "class_num"),
    (dict(seed=-1), "seed"),
])
def test_bad_arguments_name_the_argument_and_value(kw, name):
    args = dict(mixup_alpha=0.8, cutmix_alpha=0.0, class_num=K)
    args.update(kw)
    with pytest.raises(ValueError, match=name) as err:
        BatchMixer(**args)
    assert str(list(kw.values())[-1]) in str(err.value)


def test_bad_labels_are_refused():
    m = mixer(mixup_alpha=0.8)
    images, _ = constant_batch()
    with pytest.raises(ValueError, match="labels"):
        m(images, np.array([0, 1, 2, 3, 4, K], np.int32), Info(0))
    with pytest.raises(ValueError, match="labels"):
        m(images, np.array([0, 1, 2], np.int32), Info(0))
