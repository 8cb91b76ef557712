"""Batch mixing (issue 50, item 3): ``batch_transform=MixUp/CutMix/Mixup`` against torchvision v2's
``MixUp``/``CutMix`` and timm's ``Mixup``/``FastCollateMixup`` themselves, fed the draw stoker
reports (``mix_params``): the references' own code mixes the unmixed batch of the same seed, and
stoker's images and soft labels must equal theirs bit for bit (float32 batches: torchvision's and
timm's tensor arithmetic; uint8 batches: timm's fast-collate arithmetic, rounded half to even).
Then: the draws are the same at 1, 2 and 8 threads, a resumed loader mixes as the original did,
and the mixing is in the fingerprint and the report."""

import json

import numpy as np
import pytest
import stoker
from helpers import in_python_child
from stoker import transforms as T

torch = pytest.importorskip("torch")

C = 7  # the demo's classes
TRAIN = [T.RandomResizedCrop(64), T.RandomHorizontalFlip()]
NORM = [*TRAIN, T.Normalize(T.IMAGENET_MEAN, T.IMAGENET_STD)]


def run(root, ts, mix=None, batch_size=8, **kw):
    kw = {"shuffle": True, "seed": 11, "drop_last": True, "output": "torch", "threads": 2, **kw}
    loader = stoker.ImageLoader(str(root), batch_size, transforms=ts, batch_transform=mix, **kw)
    return loader, [(x.clone(), y.clone()) for x, y in loader]


def torchvision_reference(cls, params, num_classes=C):
    """torchvision's own MixUp/CutMix, its draw replaced by stoker's."""
    from torchvision.transforms import v2

    base = getattr(v2, cls)

    class Fixed(base):  # type: ignore[misc, valid-type]
        def make_params(self, flat_inputs):
            if params["cutmix"]:
                y0, y1, x0, x1 = params["area"]
                return {"box": (x0, y0, x1, y1), "lam_adjusted": params["lam"]}
            return {"lam": params["lam"]}

    return Fixed(num_classes=num_classes)


@pytest.mark.parametrize("cls", ["MixUp", "CutMix"])
def test_torchvision_mixup_and_cutmix(demo, cls):
    # torchvision and timm are imported in a child process (helpers.in_python_child).
    in_python_child("test_mix", "check_torchvision", str(demo), cls)


def check_torchvision(demo, cls):
    _, plain = run(demo, NORM)
    mix = getattr(T, cls)(alpha=1.0, num_classes=C)
    loader, mixed = run(demo, NORM, mix)
    assert len(mixed) == len(plain) >= 5
    lams = []
    for k, ((x, y), (mx, my)) in enumerate(zip(plain, mixed)):
        p = loader.mix_params(0, k)
        assert p["cutmix"] == (cls == "CutMix")
        lams.append(p["lam"])
        rx, ry = torchvision_reference(cls, p)(x.clone(), y)
        assert my.dtype == torch.float32 and my.shape == (8, C)
        assert torch.equal(mx, rx), (k, (mx - rx).abs().max())
        assert torch.equal(my, ry), k
        assert torch.allclose(my.sum(1), torch.ones(8))
    assert len(set(lams)) == len(lams) and all(0 <= lam <= 1 for lam in lams)


def timm_reference(kind, params, **kw):
    """timm's own Mixup (or FastCollateMixup), its draws replaced by stoker's."""
    import timm.data.mixup as mixup
    ref = getattr(mixup, kind)(num_classes=C, **kw)
    ref._params_per_batch = lambda: (params["lam"], params["cutmix"])
    return ref, mixup


@pytest.mark.parametrize("dtype", ["float32", "uint8"])
def test_timm_mixup_with_switch_and_smoothing(demo, dtype):
    in_python_child("test_mix", "check_timm", str(demo), dtype)


def check_timm(demo, dtype):
    ts = NORM if dtype == "float32" else [*TRAIN, T.ToDtype("uint8")]
    kw = {"mixup_alpha": 0.8, "cutmix_alpha": 1.0, "switch_prob": 0.5, "label_smoothing": 0.1}
    mix = T.Mixup(**kw, prob=0.9, num_classes=C)
    _, plain = run(demo, ts)
    loader, mixed = run(demo, ts, mix)
    kinds = set()
    for k, ((x, y), (mx, my)) in enumerate(zip(plain, mixed)):
        p = loader.mix_params(0, k)
        kinds.add("none" if p["lam"] == 1.0 else "cutmix" if p["cutmix"] else "mixup")
        ref, mixup = timm_reference("Mixup" if dtype == "float32" else "FastCollateMixup", p, **kw)
        if p["cutmix"]:
            # timm's box from stoker's: its lambda correction then recomputes stoker's lambda.
            mixup.rand_bbox = lambda *a, _b=p["area"], **k: tuple(_b)
        if dtype == "float32":
            rx, ry = ref(x.clone(), y)
        else:
            rx, ry = ref([(img.numpy(), int(t)) for img, t in zip(x, y)])
        assert torch.equal(mx, rx), (k, p, (mx.float() - rx.float()).abs().max())
        assert torch.equal(my, ry), (k, p)
    assert {"mixup", "cutmix"} <= kinds, kinds


def test_threads_resume_fingerprint_and_report(demo):
    mix = T.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=C)
    _, one = run(demo, NORM, mix, threads=1)
    for n in (2, 8):
        _, other = run(demo, NORM, mix, threads=n)
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(one, other)), n
    loader = stoker.ImageLoader(str(demo), 8, transforms=NORM, batch_transform=mix, shuffle=True, seed=11,
                                drop_last=True)
    it = iter(loader)
    next(it)
    next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    it.close()
    stats = {s["name"]: s for s in loader.report()["stages"]}
    assert stats["mix"]["items"] >= 1, stats.keys()
    again = stoker.ImageLoader(str(demo), 8, transforms=NORM, batch_transform=mix, shuffle=True, seed=11,
                               drop_last=True)
    again.load_state_dict(state)
    rest = [(x.clone(), y.clone()) for x, y in again]
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(rest, one[2:]))
    # Another mixing, or none, is another recipe: the state is refused.
    for other in (None, T.Mixup(mixup_alpha=0.2, num_classes=C)):
        with pytest.raises(stoker.ConfigError):
            stoker.ImageLoader(str(demo), 8, transforms=NORM, batch_transform=other, shuffle=True, seed=11,
                               drop_last=True).load_state_dict(state)


def test_what_mixing_refuses(demo):
    with pytest.raises(stoker.ConfigError, match="num_classes"):
        stoker.ImageLoader(str(demo), 8, transforms=NORM, batch_transform=T.MixUp(num_classes=3))
    with pytest.raises(stoker.ConfigError, match="num_classes"):
        T.CutMix()
    with pytest.raises(stoker.ConfigError, match="prob"):
        stoker.ImageLoader(str(demo), 8, transforms=NORM, batch_transform=T.Mixup(prob=2.0, num_classes=C))
    with pytest.raises(stoker.ConfigError, match="batch_transform"):
        stoker.ImageLoader(str(demo), 8, transforms=NORM, batch_transform=[T.MixUp(num_classes=C)])
    with pytest.raises(stoker.ConfigError, match="mode"):
        T.Mixup(mode="elem")
    # Without batch_transform the loader yields hard labels, as before.
    loader = stoker.ImageLoader(str(demo), 8, transforms=NORM, output="numpy")
    assert loader.mix_params(0, 0) is None
    _, labels = next(iter(loader))
    assert labels.dtype == np.int64


def test_a_mixture_is_mixed_too(demo):
    """A mixture's batches are mixed like one dataset's: (images, targets, sources)."""
    in_python_child("test_mix", "check_mixture", str(demo))
    # num_classes must cover the offset labels.
    root = {"a": (str(demo), 1), "b": {"root": str(demo), "weight": 1, "label_offset": C}}
    with pytest.raises(stoker.ConfigError, match="num_classes"):
        stoker.ImageLoader(root, 8, transforms=NORM, batch_transform=T.CutMix(num_classes=C))


def check_mixture(demo):
    mix = T.CutMix(alpha=1.0, num_classes=2 * C)
    root = {"a": (str(demo), 1), "b": {"root": str(demo), "weight": 1, "label_offset": C}}
    loader = stoker.ImageLoader(root, 8, transforms=NORM, batch_transform=mix, shuffle=True, seed=4, output="torch")
    plain = stoker.ImageLoader(root, 8, transforms=NORM, shuffle=True, seed=4, output="torch")
    for k, ((mx, my, ms), (x, y, s)) in enumerate(zip(loader, plain)):
        assert torch.equal(ms, s) and my.shape == (len(y), 2 * C)
        rx, ry = torchvision_reference("CutMix", loader.mix_params(0, k), 2 * C)(x.clone(), y)
        assert torch.equal(mx, rx) and torch.equal(my, ry), k
        if k == 3:
            break


def as_bytes(t):
    return t.contiguous().view(torch.uint8)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "uint8"])
def test_the_gpu_mixer_is_the_host_arithmetic(demo, dtype, layout):
    """What ``device='cuda'`` does, on the CPU: the engine leaves a GPU batch's images uint8 and
    unmixed, the Normalizer makes them ``dtype`` and the Mixer applies the batch's draw with torch
    ops. Applied to host uint8 batches of the same seed, that must give the engine's host-mixed
    batches byte for byte, for both partners (roll, flip), MixUp and CutMix, both layouts, and the
    short last batch (96 = 7 * 13 + 5: an odd one, whose middle sample timm mixes with itself)."""
    from stoker._gpu import Mixer, Normalizer

    kw = {"layout": layout, "drop_last": False}
    loader = stoker.ImageLoader(str(demo), 13, transforms=TRAIN, shuffle=True, seed=11, output="torch", **kw)
    raw = [(x.clone(), y.clone()) for x, y in loader]  # uint8, unnormalised: what crosses the bus
    assert raw[0][0].dtype == torch.uint8 and len(raw[-1][1]) == 5
    channels_last = layout == "NHWC"
    norm = Normalizer(T.IMAGENET_MEAN, T.IMAGENET_STD, dtype, channels_last) if dtype != "uint8" else None
    ts = NORM if dtype != "uint8" else [*TRAIN, T.ToDtype("uint8")]
    out_dtype = None if dtype == "uint8" else dtype
    mixes = {"torchvision MixUp": T.MixUp(alpha=1.0, num_classes=C),
             "torchvision CutMix": T.CutMix(alpha=1.0, num_classes=C),
             "timm Mixup": T.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, prob=1.0, switch_prob=0.5, num_classes=C)}
    for name, mix in mixes.items():
        mixed_loader, mixed = run(demo, ts, mix, dtype=out_dtype, batch_size=13, **kw)
        mixer = Mixer(mix.spec()["style"], channels_last)
        assert len(mixed) == len(raw)
        kinds, changed = set(), 0
        for k, ((x, _), (mx, _)) in enumerate(zip(raw, mixed)):
            p = mixed_loader.mix_params(0, k)
            kinds.add("cutmix" if p["cutmix"] else "mixup")
            plain = norm(x) if norm is not None else x
            got = mixer(plain.clone(), p, inplace=norm is not None)
            assert got.dtype == mx.dtype == getattr(torch, dtype) and got.shape == mx.shape
            assert torch.equal(as_bytes(got), as_bytes(mx)), (name, k, p, (got.float() - mx.float()).abs().max())
            changed += not torch.equal(as_bytes(plain), as_bytes(mx))
        assert changed >= len(raw) // 2, (name, changed)  # the comparisons are of mixed batches
        if name == "timm Mixup":
            assert kinds == {"cutmix", "mixup"}, kinds
    # The raw uint8 batch is not written when the caller does not own it; no draw, no change.
    x = raw[0][0]
    before = x.clone()
    Mixer("timm", channels_last)(x, {"cutmix": True, "lam": 0.5, "area": [0, 32, 0, 32]})
    assert torch.equal(x, before)
    assert Mixer("timm", channels_last)(x, None) is x
    one = x[:1]
    assert Mixer("timm", channels_last)(one, {"cutmix": False, "lam": 0.5, "area": None}) is one
