"""Decoding like the references (issue 19, item 8), with Pillow as the reference: files Pillow
loads despite a libjpeg warning in the header (extraneous bytes before a marker, a bad ICC
marker) are delivered; a JPEG missing its end is skipped in every epoch, whatever the random
crop; a PNG's EXIF orientation (``eXIf`` chunk) is applied as ``ImageOps.exif_transpose`` does;
a 12-bit JPEG is named as unsupported. Every file is made by the test from the demo photos."""

import io

import numpy as np
import pytest
import stoker
from PIL import Image, ImageOps


def first_jpeg(demo):
    return sorted((demo / "rocket").iterdir())[0].read_bytes()


def insert_before(data, marker, extra):
    """``data`` with ``extra`` placed before its first ``FF marker``."""
    at = data.index(bytes([0xFF, marker]))
    return data[:at] + extra + data[at:]


def pillow_val(img):
    """torchvision's Resize(256) + CenterCrop(224) on a PIL image (see
    tests/python/test_pillow_reference.py)."""
    img = img.convert("RGB")
    w, h = img.size
    short, long = (w, h) if w <= h else (h, w)
    size = (256, int(256 * long / short)) if w <= h else (int(256 * long / short), 256)
    img = img.resize(size, Image.BILINEAR)
    w, h = img.size
    top, left = int(round((h - 224) / 2.0)), int(round((w - 224) / 2.0))
    return np.asarray(img.crop((left, top, left + 224, top + 224)))


def folder(tmp_path, files):
    """An ImageFolder with one class holding ``files`` (name -> bytes)."""
    root = tmp_path / "data"
    (root / "c").mkdir(parents=True)
    for name, data in files.items():
        (root / "c" / name).write_bytes(data)
    return root


def val_images(root, **kw):
    """Every image of ``root`` through the val preset, as uint8 HWC, in dataset order, and
    the report."""
    loader = stoker.ImageLoader(str(root), 8, preset="imagenet-val", dtype="uint8", layout="NHWC",
                                output="numpy", dct_scaling=False, **kw)
    out = [np.array(x) for images, _ in loader for x in images]
    return out, loader.report()


def test_header_warnings_are_tolerated_like_pillow(demo, tmp_path):
    good = first_jpeg(demo)
    # libjpeg: "Corrupt JPEG data: 4 extraneous bytes before marker 0xdb" while reading the
    # header; an APP2 ICC_PROFILE chunk numbered 2 of 1 ("bad ICC marker" where libjpeg
    # assembles ICC profiles). Regression: both were skipped as "invalid JPEG".
    junk = insert_before(good, 0xDB, b"\x00\x11\x22\x33")
    icc = good[:2] + b"\xff\xe2\x00\x14ICC_PROFILE\x00\x02\x01" + b"\x09" * 4 + good[2:]
    for data in (junk, icc):
        Image.open(io.BytesIO(data)).load()  # the reference loads them
    root = folder(tmp_path, {"a_good.jpg": good, "b_junk.jpg": junk, "c_icc.jpg": icc})
    images, report = val_images(root)
    assert report["skipped"] == []
    assert len(images) == 3
    assert np.array_equal(images[0], images[1]) and np.array_equal(images[0], images[2])
    # Counted: the file with the warning (the ICC profile is never read, so no warning there).
    assert report["decode_warnings"] == 1
    # The same pixels Pillow gives for the file (exact decode, Pillow's resampling).
    ref = pillow_val(Image.open(io.BytesIO(junk))).astype(np.int16)
    diff = np.abs(images[1].astype(np.int16) - ref)
    assert diff.mean() <= 0.05 and diff.max() <= 2, (diff.mean(), diff.max())


def test_a_truncated_jpeg_gets_the_same_verdict_every_epoch(demo, tmp_path):
    # A JPEG missing only its final two bytes (the end-of-image marker). Pillow refuses it; a
    # random crop that stops above the last rows never reads the end of the data, so the
    # verdict depended on the crop (regression: delivered in 11 of 20 epochs).
    files = {p.name: p.read_bytes() for p in sorted((demo / "rocket").iterdir())[:7]}
    good = files.pop(sorted(files)[0])
    with pytest.raises(OSError, match="truncated"):
        Image.open(io.BytesIO(good[:-2])).load()
    files["zz_cut.jpg"] = good[:-2]
    root = folder(tmp_path, files)
    loader = stoker.ImageLoader(str(root), 4, preset="imagenet-train", shuffle=True, seed=3,
                                output="numpy", threads=2)
    for epoch in range(20):
        loader.set_epoch(epoch)
        delivered = sum(len(y) for _, y in loader)
        report = loader.report()
        assert delivered == 6, f"epoch {epoch}: {delivered} delivered"
        assert report["skipped_count"] == epoch + 1, f"epoch {epoch}: {report['skipped']}"
    reasons = {s["reason"] for s in loader.report()["skipped"]}
    assert len(reasons) == 1, reasons
    assert "truncated" in reasons.pop()
    assert all(s["path"].endswith("zz_cut.jpg") for s in loader.report()["skipped"])


def png_bytes(pixels, orientation=None, prefix=b""):
    out = io.BytesIO()
    kw = {}
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        kw["exif"] = prefix + exif.tobytes()
    Image.fromarray(pixels).save(out, "PNG", **kw)
    return out.getvalue()


def test_png_exif_orientation_is_applied_like_exif_transpose(demo, tmp_path):
    # A non-square photo, so every orientation changes the crop.
    photo = Image.open(io.BytesIO(first_jpeg(demo))).convert("RGB")
    pixels = np.asarray(photo.resize((300, 260)))
    files = {f"o{o}.png": png_bytes(pixels, o) for o in range(1, 9)}
    files["x_none.png"] = png_bytes(pixels)
    files["y_prefixed.png"] = png_bytes(pixels, 6, prefix=b"Exif\x00\x00")
    root = folder(tmp_path, files)
    names = sorted(files)
    images, report = val_images(root)
    assert report["skipped"] == [] and len(images) == len(names)
    for name, got in zip(names, images):
        img = Image.open(io.BytesIO(files[name]))
        want = pillow_val(ImageOps.exif_transpose(img))
        assert np.array_equal(got, want), name
    # apply_exif=False: the stored pixels, as torchvision's PIL loader gives them.
    plain, _ = val_images(root, apply_exif=False)
    want = pillow_val(Image.fromarray(pixels))
    assert all(np.array_equal(got, want) for got in plain)
    assert not np.array_equal(images[names.index("o6.png")], want)


def test_a_12_bit_jpeg_is_named_unsupported(demo, tmp_path):
    # The header of a 12-bit (extended sequential, SOF1) JPEG. Pillow cannot open it either.
    data = bytearray(first_jpeg(demo))
    sof = data.index(b"\xff\xc0")
    data[sof + 1], data[sof + 4] = 0xC1, 12
    with pytest.raises(OSError):
        Image.open(io.BytesIO(bytes(data))).load()
    root = folder(tmp_path, {"deep.jpg": bytes(data), "good.jpg": first_jpeg(demo)})
    images, report = val_images(root)
    assert len(images) == 1
    [skipped] = report["skipped"]
    assert skipped["path"].endswith("deep.jpg")
    assert "unsupported: 12-bit JPEG" in skipped["reason"], skipped

