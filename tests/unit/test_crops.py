"""--crop random_resized (torchvision's RandomResizedCrop, planned per stream position and cut by
either decode path, the JPEG reduced where the box allows it) and the test images' sizes
(--test_resize, --test_image_size: FixRes)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from torchvision.transforms import RandomResizedCrop

from resnet50_trainer.data import transforms
from resnet50_trainer.data.cpu_decode import CpuDecode
from resnet50_trainer.data.dataset import ImageRecords
from resnet50_trainer.data.formats.databases import read_keys
from resnet50_trainer.data.formats.images import decode_jpeg_reduced
from resnet50_trainer.data.input_pipeline import make_loader
from resnet50_trainer.data.settings import (
    DEFAULT_CROP_AREA,
    DEFAULT_CROP_RATIO,
    RANDOM_RESIZED_CROP,
    InputSettings,
)
from resnet50_trainer.train.inputs import input_settings
from tests.support.dbfactory import datum_record, make_jpeg, write_db
from tests.support.trainer_runs import config_of, refused_in_process

SMALL_RUN_FLAGS = ("--use_cpu", "--image_size", "32")
SIZES = [(400, 300), (300, 400), (64, 64), (1000, 40), (40, 1000), (33, 2000), (500, 499)]


def boxes(width, height, area=DEFAULT_CROP_AREA, ratio=DEFAULT_CROP_RATIO, seeds=range(300)):
    return [
        transforms.random_resized_box(width, height, area, ratio, random.Random(seed))
        for seed in seeds
    ]


def torchvision_boxes(width, height, area=DEFAULT_CROP_AREA, ratio=DEFAULT_CROP_RATIO, count=300):
    """RandomResizedCrop.get_params as (left, top, right, bottom), from a fixed torch seed."""
    torch.manual_seed(0)
    image = torch.empty(1, height, width)
    found = []
    for _ in range(count):
        top, left, box_h, box_w = RandomResizedCrop.get_params(image, list(area), list(ratio))
        found.append((left, top, left + box_w, top + box_h))
    return found


def test_random_resized_boxes_keep_torchvision_s_area_and_ratio_bounds():
    """Inside the image, and (a side being rounded to whole pixels) within the area and ratio
    bounds, unless all 10 tries failed and the centre fallback was taken, as torchvision's."""
    for width, height in SIZES:
        fallback = torchvision_fallback(width, height, DEFAULT_CROP_AREA, DEFAULT_CROP_RATIO)
        for left, top, right, bottom in boxes(width, height):
            assert 0 <= left < right <= width and 0 <= top < bottom <= height
            box_w, box_h = right - left, bottom - top
            if (left, top, right, bottom) == fallback:
                continue
            low_area, high_area = (box_w - 0.5) * (box_h - 0.5), (box_w + 0.5) * (box_h + 0.5)
            assert low_area <= 1.0 * width * height and high_area >= 0.08 * width * height
            assert (box_w + 0.5) / (box_h - 0.5) >= 3 / 4 and (box_w - 0.5) / (box_h + 0.5) <= 4 / 3


def torchvision_fallback(width, height, area, ratio):
    """torchvision's box when every try fails: tries that cannot succeed (area near 0) leave it."""
    (box,) = torchvision_boxes(width, height, (1e-12, 1e-12), ratio, count=1)
    return box


@pytest.mark.parametrize(
    "width, height, area, ratio",
    [
        (100, 10, (0.9, 1.0), (1.0, 1.0)),  # too wide for any try: a centred square
        (10, 100, (0.9, 1.0), (1.0, 1.0)),  # too tall
        (120, 90, (1e-9, 1e-9), (0.5, 2.0)),  # boxes of no pixel: the whole image
        (50, 3, (1e-9, 1e-9), (0.001, 0.002)),  # a side rounded to 0 keeps 1 pixel
    ],
)
def test_when_every_try_fails_the_box_is_torchvision_s_centre_fallback(width, height, area, ratio):
    (ours,) = boxes(width, height, area, ratio, seeds=[1])
    (theirs,) = torchvision_boxes(width, height, area, ratio, count=1)
    if ratio == (0.001, 0.002):  # torchvision's own box here has a width of 0
        assert theirs[2] - theirs[0] == 0 and ours == (24, 0, 25, 3)
    else:
        assert ours == theirs


def test_random_resized_boxes_are_distributed_as_torchvision_s():
    """Quartiles of the area share and of log(width / height), ours (Python's RNG) against
    torchvision's (torch's), 2000 boxes each of a 400 x 300 image."""
    ours, theirs = boxes(400, 300, seeds=range(2000)), torchvision_boxes(400, 300, count=2000)

    def quartiles(found):
        shares = [(r - x) * (b - y) / (400 * 300) for x, y, r, b in found]
        log_ratios = [math.log((r - x) / (b - y)) for x, y, r, b in found]
        return np.quantile(shares, [0.25, 0.5, 0.75]), np.quantile(log_ratios, [0.25, 0.5, 0.75])

    for mine, reference in zip(quartiles(ours), quartiles(theirs)):
        assert np.abs(mine - reference).max() < 0.04, (mine, reference)


def crop_records(path, crop=RANDOM_RESIZED_CROP, train=True, **sizes):
    settings = InputSettings(4, 3, sizes.get("scale", 40), sizes.get("size", 32), 7, 0, False, crop)
    return ImageRecords(path, "lmdb", read_keys(path, "lmdb"), settings, train, CpuDecode(settings))


def test_a_stream_position_always_draws_the_same_random_resized_crop(image_db):
    records = crop_records(image_db("train", 4, 4), size=64, scale=80)
    plans = [records.crop_plan(position, 400, 300, True) for position in range(40)]
    assert [records.crop_plan(position, 400, 300, True) for position in range(40)] == plans
    assert len({plan.crop.box for plan in plans}) == 40
    assert {plan.crop.mirror for plan in plans} == {True, False}
    # Boxes of about 100 to 346 pixels a side (8% to all of the area) at 64 pixels out.
    assert {plan.reduction for plan in plans} == {1, 2, 4}


def test_a_reduced_decode_plan_is_the_full_size_box_in_the_smaller_image():
    """The box of a reduced decode, scaled back, is the full-size box up to the rounding of its
    corners to whole reduced pixels, and keeps at least the output's pixels a side."""
    for width, height in SIZES:
        for seed in range(100):
            full, reduced = (
                transforms.random_resized_plan(
                    width,
                    height,
                    32,
                    DEFAULT_CROP_AREA,
                    DEFAULT_CROP_RATIO,
                    random.Random(seed),
                    reducible,
                )
                for reducible in (False, True)
            )
            factor = reduced.reduction
            assert full.reduction == 1 and full.crop.mirror == reduced.crop.mirror
            left, top, right, bottom = reduced.crop.box
            assert right <= -(-width // factor) and bottom <= -(-height // factor)
            if factor > 1:
                assert min(right - left, bottom - top) >= 32
            scaled_back = np.array(reduced.crop.box) * factor
            assert np.abs(scaled_back - np.array(full.crop.box)).max() <= factor


def test_a_reduced_decode_cuts_the_pixels_of_the_full_decode():
    """The same random-resized plan cut from a 1/2 or 1/4 DCT decode and from the full-size
    decode: under 2 levels a pixel on average (here 0.3 to 0.8: the DCT's filter against PyTorch's
    antialiased bilinear, and the box's corners rounded to whole reduced pixels)."""
    data = make_jpeg(600, 800, seed=5)
    seen = set()
    for seed in range(12):
        full, reduced = (
            transforms.random_resized_plan(
                800, 600, 96, DEFAULT_CROP_AREA, DEFAULT_CROP_RATIO, random.Random(seed), reducible
            )
            for reducible in (False, True)
        )
        seen.add(reduced.reduction)
        full_crop, reduced_crop = (
            transforms.resize_crop(
                torch.from_numpy(decode_jpeg_reduced(data, (800, 600), plan.reduction)).permute(
                    2, 0, 1
                ),
                plan.crop,
                96,
            ).float()
            for plan in (full, reduced)
        )
        assert (full_crop - reduced_crop).abs().mean() < 2
    assert seen == {2, 4}


def test_test_images_are_resized_and_centred_at_the_test_sizes(tmp_path):
    """FixRes as torchvision's recipe, at this test's scale: trained on 32-pixel random-resized
    crops, tested on the centre 48 of images resized to 52."""
    records = [
        (b"%08d" % i, datum_record(i % 4, encoded=make_jpeg(70, 90, seed=i))) for i in range(4)
    ]
    db = write_db(str(tmp_path / "db"), "lmdb", records)
    flags = ("--train_data", "null", "--crop", "random_resized", "--test_resize", "52")
    config = config_of(*SMALL_RUN_FLAGS, *flags, "--test_image_size", "48")
    train, test = input_settings(config, train=True), input_settings(config, train=False)
    assert (train.crop, train.image_size, test.crop, test.scale, test.image_size) == (
        RANDOM_RESIZED_CROP,
        32,
        "scale",
        52,
        48,
    )
    test_records = ImageRecords(db, "lmdb", read_keys(db, "lmdb"), test, False, CpuDecode(test))
    batch = next(iter(make_loader(test_records, [[0, 1, 2, 3]], 0, False)))
    assert batch.images.shape == (4, 3, 48, 48)
    # Without the test flags: the training's --scale and --image_size, as before.
    assert config_of(*SMALL_RUN_FLAGS, "--train_data", "null").test_sizes == (37, 32)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--crop_area", "0,1"], "argument --crop_area: invalid value '0,1': use MIN,MAX"),
        (["--crop_area", "0.5,0.1"], "MIN at most MAX, each a number above 0 up to 1"),
        (["--crop_area", "0.1"], "invalid value '0.1'"),
        (["--crop_area", "0.1,0.2,0.3"], "invalid value '0.1,0.2,0.3'"),
        (["--crop_area", "nan,1"], "invalid value 'nan,1'"),
        (["--crop_area", "0.08,1.5"], "invalid value '0.08,1.5'"),
        (["--crop_ratio", "0.75,inf"], "argument --crop_ratio: invalid value '0.75,inf'"),
        (["--crop_ratio", "0,1"], "each a number from 0.001 to 1000"),
        (["--crop_ratio", "1e308,1e308"], "invalid value '1e308,1e308'"),
        (["--crop", "random"], "argument --crop: invalid choice: 'random'"),
        (["--crop_area", "0.5,1"], "--crop_area bounds the boxes of --crop random_resized"),
        (["--crop", "scale", "--crop_ratio", "1,2"], "add --crop random_resized or leave"),
        (["--test_image_size", "64"], "--test_image_size 64 is above --scale 37 (the test images'"),
        (["--test_resize", "40", "--test_image_size", "48"], "above --test_resize 40"),
        (["--image_size", "64", "--test_resize", "40"], "--image_size 64 is above --test_resize"),
        (["--test_resize", "20"], "argument --test_resize: invalid value '20'"),
    ],
)
def test_bad_crop_and_test_size_flags_are_refused_in_one_line(capsys, args, words):
    line = refused_in_process(capsys, "--train_data", "null", *args)
    assert words in line, line
