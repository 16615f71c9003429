"""Decoding only a crop's box (data/formats/jpeg_region.py and its C module) and the batch path of
the CPU strategy (CpuDecode.batch): the same pixels as a whole-frame decode, the same crops as a
full-size decode followed by the same crop and resize (within the bound stated below where the
DCT scale applies), and the same batches whichever process or path makes them."""

from __future__ import annotations

import io

import numpy as np
import pytest
import simplejpeg
import torch
from PIL import Image

from resnet50_trainer.data import transforms
from resnet50_trainer.data.cpu_decode import CpuDecode
from resnet50_trainer.data.dataset import ImageRecords
from resnet50_trainer.data.formats import jpeg_region
from resnet50_trainer.data.formats.databases import read_keys
from resnet50_trainer.data.formats.images import gray_pixels
from resnet50_trainer.data.input_pipeline import make_loader
from resnet50_trainer.data.settings import RANDOM_RESIZED_CROP, SCALE_CROP, InputSettings
from resnet50_trainer.errors import RecordError
from tests.support.dbfactory import datum_record, make_jpeg, smooth_pixels, write_db

# A crop decoded at 1/2 to 1/8 scale against the full-size decode's crop, both resized to the
# output: libjpeg's scaled IDCT drops the high frequencies the resize would have filtered, a
# little differently, so the two differ by about a level on average (at most 1.1 of 255 on these
# noisy test images), with no shift in brightness (a mean under 0.8 level), and by more at single
# sharp edges (no bound on single pixels). Crops decoded at full size are equal bit for bit.
REDUCED_MEAN_ABS_DIFFERENCE = 2.0
REDUCED_MEAN_BIAS = 1.0


def photo(
    width: int,
    height: int,
    seed: int,
    subsampling: int = 2,
    gray: bool = False,
    progressive: bool = False,
) -> bytes:
    """A JPEG of smooth gradients and noise; subsampling as Pillow's (0 4:4:4, 1 4:2:2, 2 4:2:0)."""
    pixels = smooth_pixels(height, width, 1 if gray else 3, seed)
    image = Image.fromarray(pixels[:, :, 0] if gray else pixels)
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90, subsampling=subsampling, progressive=progressive)
    return buffer.getvalue()


def test_the_region_decoder_is_built():
    assert jpeg_region.REGION_DECODE, (
        "resnet50_trainer/data/formats/_jpeg_region.c is not built: run scripts/setup.sh, or "
        "`python setup.py build_ext --inplace` (needs gcc and libjpeg's headers, libjpeg-dev)"
    )


def with_markers(data: bytes, markers: str) -> bytes:
    """`data` as is (""), rewritten with a restart marker after every MCU ("every MCU", as
    resnet50-db create --restart_markers writes them), or encoded by Pillow with one every 2
    MCUs or every MCU row (as some cameras write them; "2 MCUs", "rows")."""
    if not markers:
        return data
    if markers == "every MCU":
        marked = jpeg_region.with_restart_markers(data)
        assert np.array_equal(simplejpeg.decode_jpeg(marked), simplejpeg.decode_jpeg(data))
        return marked
    buffer = io.BytesIO()
    interval = {"restart_marker_blocks": 2} if markers == "2 MCUs" else {"restart_marker_rows": 1}
    Image.open(io.BytesIO(data)).save(buffer, "JPEG", quality=90, **interval)
    return buffer.getvalue()


# (subsampling, gray, progressive): each without and with restart markers after every MCU; and
# the intervals some cameras write, on 4:2:0.
LAYOUTS = [
    (0, False, False),
    (1, False, False),
    (2, False, False),
    (2, True, False),
    (1, False, True),
]


@pytest.mark.parametrize(
    "subsampling, gray, progressive, markers",
    [(*layout, markers) for markers in ("", "every MCU") for layout in LAYOUTS]
    + [(2, False, False, "2 MCUs"), (2, False, False, "rows")],
    ids=str,
)
def test_a_box_decodes_to_the_whole_frames_pixels(subsampling, gray, progressive, markers):
    """Any box, at every scale, in gray or colour out: the whole frame's pixels, bit for bit,
    including the box's edge columns (where chroma upsampling needs the columns beside them);
    with restart markers too, where only the MCUs round the box are decoded, and a file
    rewritten with them decodes to the original's pixels."""
    rng = np.random.default_rng(subsampling)
    for seed, (width, height) in enumerate([(173, 131), (64, 48), (301, 97), (17, 9)]):
        data = with_markers(photo(width, height, seed, subsampling, gray, progressive), markers)
        for reduction in (1, 2, 4, 8):
            rgb = simplejpeg.decode_jpeg(
                data, min_height=-(-height // reduction), min_width=-(-width // reduction)
            )
            for channels in (1, 3):
                whole = rgb if channels == 3 else gray_pixels(rgb)  # gray: the one definition
                rows, columns = whole.shape[:2]
                for _ in range(12):
                    box_w, box_h = int(rng.integers(1, columns + 1)), int(rng.integers(1, rows + 1))
                    left = int(rng.integers(0, columns - box_w + 1))
                    top = int(rng.integers(0, rows - box_h + 1))
                    box = (left, top, left + box_w, top + box_h)
                    decoded = jpeg_region.decode_jpeg_box(
                        data, (width, height), channels, reduction, box
                    )
                    assert np.array_equal(decoded, whole[top : top + box_h, left : left + box_w])


@pytest.mark.parametrize("markers", ["", "every MCU"])
def test_every_narrow_box_of_a_small_image_decodes_to_the_whole_frames_pixels(markers):
    """Boxes 1 to 4 pixels wide at every column, the whole height or one row: the edge columns
    are where the decoded region is narrowest, and where 4:2:0 chroma once came out repeated
    instead of fancy-upsampled (a 1-pixel box at the left edge, or at the right edge of a width
    of 16k + 2: its 2 columns held 1 chroma sample, and libjpeg-turbo's jpeg_crop_scanline then
    re-initialises the upsampler)."""
    for seed, (width, height, subsampling) in enumerate(
        [(5, 4, 2), (18, 6, 2), (9, 7, 2), (34, 5, 2), (18, 6, 1), (7, 3, 0)]
    ):
        data = with_markers(photo(width, height, seed, subsampling), markers)
        for reduction in (1, 2):
            columns, rows = -(-width // reduction), -(-height // reduction)
            whole = simplejpeg.decode_jpeg(data, min_height=rows, min_width=columns)
            assert whole.shape[:2] == (rows, columns)  # simplejpeg picked 1/reduction
            for box_w in range(1, min(4, columns) + 1):
                for left in range(columns - box_w + 1):
                    for top, box_h in {(0, rows), (rows // 2, 1)}:
                        box = (left, top, left + box_w, top + box_h)
                        decoded = jpeg_region.decode_jpeg_box(
                            data, (width, height), 3, reduction, box
                        )
                        expected = whole[top : top + box_h, left : left + box_w]
                        assert np.array_equal(decoded, expected), (width, height, reduction, box)


def test_the_region_decoder_refuses_what_it_cannot_do():
    data = make_jpeg(32, 48)
    out = np.empty((32, 48, 3), np.uint8)
    decode = jpeg_region.decode_region
    assert decode is not None
    for arguments, message in [
        ((3, 0, 0, 8, 8, 3), "reduction"),
        ((1, 0, 0, 8, 8, 2), "channels"),
        ((1, -1, 0, 8, 8, 3), "box"),
        ((1, 0, 0, 0, 8, 3), "box"),
        ((1, 41, 0, 8, 8, 3), "outside"),
        ((2, 0, 0, 48, 32, 3), "outside"),  # the image is 24 x 16 at half scale
        ((8, 2**31 - 2, 0, 5, 1, 3), "outside any JPEG"),  # no int overflow on the way
    ]:
        with pytest.raises(ValueError, match=message):
            decode(data, *arguments, out)
    with pytest.raises(ValueError, match="smaller"):
        decode(data, 1, 0, 0, 48, 32, 3, np.empty(10, np.uint8))
    with pytest.raises(TypeError):
        decode(data, 1, 0, 0, 8, 8, 3, b"read-only")
    for damaged in (b"", b"\xff\xd8", b"not a jpeg at all", data[: len(data) // 2]):
        with pytest.raises(ValueError):
            decode(damaged, 1, 0, 0, 8, 8, 3, out)


def test_damaged_files_with_restart_markers_decode_or_are_refused():
    """The window cut from a file's restart intervals trusts nothing in it: bytes changed, cut
    or inserted anywhere (headers, markers, data), each random box decodes or raises ValueError,
    and none crashes (scripts/fuzz_region_decode.py does the same at length)."""
    rng = np.random.default_rng(7)
    files = [
        jpeg_region.with_restart_markers(photo(w, h, seed))
        for seed, (w, h) in enumerate([(173, 131), (301, 97), (64, 48)])
    ]
    decode = jpeg_region.decode_region
    assert decode is not None
    outcomes = {"decoded": 0, "refused": 0}
    for trial in range(600):
        data = bytearray(files[trial % len(files)])
        at = int(rng.integers(0, len(data)))
        kind = trial % 3
        if kind == 0:
            data[at] = int(rng.integers(0, 256))
        elif kind == 1:
            del data[at:]
        else:
            data[at:at] = bytes([0xFF, int(rng.integers(0xC0, 0x100))])
        left, top = int(rng.integers(0, 40)), int(rng.integers(0, 40))
        width, height = int(rng.integers(1, 40)), int(rng.integers(1, 40))
        out = np.empty((height, width, 3), np.uint8)
        try:
            decode(bytes(data), 1, left, top, width, height, 3, out)
            outcomes["decoded"] += 1
        except ValueError:
            outcomes["refused"] += 1
    assert min(outcomes.values()) > 50, outcomes  # both ways were exercised


def test_rewriting_with_restart_markers_keeps_the_files_markers_and_refuses_damage():
    """EXIF (its orientation) and the ICC profile survive; a damaged file is a RecordError."""
    image = Image.open(io.BytesIO(photo(64, 48, 3)))
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90, exif=exif, icc_profile=b"an ICC profile, in truth")
    marked = Image.open(io.BytesIO(jpeg_region.with_restart_markers(buffer.getvalue())))
    assert marked.getexif()[0x0112] == 6
    assert marked.info["icc_profile"] == b"an ICC profile, in truth"
    data = buffer.getvalue()
    for damaged in (data[: len(data) // 2], b"not a jpeg", b""):
        with pytest.raises(RecordError):
            jpeg_region.with_restart_markers(damaged)


def photo_db(path: str, db_type: str = "lmdb") -> tuple[str, list[bytes]]:
    """Records of several sizes and subsamplings, large enough for 1/2 to 1/8 decodes of 32 px
    crops, one gray, one progressive."""
    sizes = [(300, 220), (220, 300), (97, 61), (640, 480), (150, 150), (257, 129)]
    files = [photo(w, h, seed, seed % 3) for seed, (w, h) in enumerate(sizes)]
    files.append(photo(200, 160, 9, gray=True))
    files.append(photo(330, 250, 10, progressive=True))
    write_db(
        path,
        db_type,
        [(b"%08d" % i, datum_record(i % 3, encoded=data)) for i, data in enumerate(files)],
    )
    return path, files


def records_of(path: str, crop: str, db_type: str = "lmdb", workers: int = 0) -> ImageRecords:
    settings = InputSettings(3, 3, 37, 32, 11, workers, False, crop)
    return ImageRecords(
        path, db_type, read_keys(path, db_type), settings, True, CpuDecode(settings)
    )


def batches(records: ImageRecords, items: list, workers: int = 0) -> list:
    return list(make_loader(records, items, workers, pin_memory=False))


@pytest.mark.parametrize("crop", [RANDOM_RESIZED_CROP, SCALE_CROP])
def test_crops_match_a_full_decode_then_the_same_crop_and_resize(tmp_path, crop):
    """The training distribution is unchanged: each crop of the pipeline against the full-size
    decode of the file, cut by the same plan (the RNG of its stream position) and resized."""
    path, files = photo_db(str(tmp_path / "db"))
    records = records_of(path, crop)
    items = [(position, position % len(files)) for position in range(70)]
    (batch,) = batches(records, [items])
    reduced = 0
    for (position, index), image in zip(items, batch.images):
        full = torch.from_numpy(simplejpeg.decode_jpeg(files[index])).permute(2, 0, 1)
        width, height = full.shape[2], full.shape[1]
        planned = records.crop_plan(position, width, height, True)
        assert planned.crop.mirror == records.crop_plan(position, width, height, False).crop.mirror
        if planned.reduction == 1:
            plan = records.crop_plan(position, width, height, False).crop
            assert torch.equal(image, transforms.resize_crop(full, plan, 32)), (position, index)
            continue
        # The same crop: the box as decoded (in whole reduced pixels; the rounding of the plan's
        # box to them is tests/unit/test_crops.py's), at full size.
        left, top, right, bottom = (
            min(side, corner * planned.reduction)
            for side, corner in zip((width, height, width, height), planned.crop.box)
        )
        plan = transforms.CropPlan((left, top, right, bottom), planned.crop.mirror)
        difference = image.float() - transforms.resize_crop(full, plan, 32).float()
        assert difference.abs().mean() <= REDUCED_MEAN_ABS_DIFFERENCE, (position, index)
        assert difference.mean().abs() <= REDUCED_MEAN_BIAS, (position, index)
        reduced += 1
    assert reduced >= 10  # the bound was exercised


@pytest.mark.parametrize("crop", [RANDOM_RESIZED_CROP, SCALE_CROP])
def test_every_path_makes_the_same_batches(tmp_path, crop, monkeypatch):
    """Batch path, record-by-record path, input processes or not, region decode or whole frames:
    the same crops for the same seed and position (what exact resume relies on), bad records
    filled the same way."""
    path, files = photo_db(str(tmp_path / "db"))
    with_bad = str(tmp_path / "with_bad")
    cut = files[0][: len(files[0]) * 2 // 3]  # no EOI marker: decoded whole, found cut
    records_list = [(b"%08d" % i, datum_record(0, encoded=data)) for i, data in enumerate(files)]
    records_list.insert(2, (b"%08d_cut" % 2, datum_record(0, encoded=cut)))
    records_list.insert(4, (b"%08d_junk" % 3, b"\x08\x01junk"))
    write_db(with_bad, "lmdb", records_list)
    for db in (path, with_bad):
        count = len(read_keys(db, "lmdb"))
        items = [[(position, position % count) for position in range(b, b + 6)] for b in (0, 6)]
        # Input processes first: an LMDB this process has open cannot be opened in a fork.
        in_workers = batches(records_of(db, crop, workers=2), items, workers=2)
        records = records_of(db, crop)
        batched = batches(records, items)
        one_by_one = [
            records.decoding.collate([records[item] for item in batch_items])
            for batch_items in items
        ]
        monkeypatch.setattr(jpeg_region, "decode_region", None)
        whole_frames = batches(records_of(db, crop), items)
        monkeypatch.undo()
        for other in (one_by_one, in_workers, whole_frames):
            for mine, theirs in zip(batched, other):
                assert torch.equal(mine.images, theirs.images)
                assert torch.equal(mine.labels, theirs.labels)
                assert mine.bad_keys == theirs.bad_keys
    assert {key for batch in batched for key in batch.bad_keys} == {
        b"00000002_cut",
        b"00000003_junk",
    }


@pytest.mark.parametrize("crop", [RANDOM_RESIZED_CROP, SCALE_CROP])
def test_a_database_with_restart_markers_gives_the_same_batches(tmp_path, crop):
    """Its records rewritten as resnet50-db create --restart_markers writes them: the crops,
    decoded from the MCUs round each box, are the plain database's, bit for bit."""
    plain, files = photo_db(str(tmp_path / "plain"))
    marked = write_db(
        str(tmp_path / "marked"),
        "lmdb",
        [
            (b"%08d" % i, datum_record(i % 3, encoded=jpeg_region.with_restart_markers(data)))
            for i, data in enumerate(files)
        ],
    )
    items = [[(position, position % len(files)) for position in range(b, b + 12)] for b in (0, 12)]
    for mine, theirs in zip(
        batches(records_of(marked, crop), items), batches(records_of(plain, crop), items)
    ):
        assert torch.equal(mine.images, theirs.images) and torch.equal(mine.labels, theirs.labels)


def test_a_leveldb_gives_the_lmdbs_batches(tmp_path):
    lmdb_path, _ = photo_db(str(tmp_path / "lmdb"))
    leveldb_path, _ = photo_db(str(tmp_path / "leveldb"), "leveldb")
    items = [[(position, position % 8) for position in range(9)]]
    (from_lmdb,) = batches(records_of(lmdb_path, RANDOM_RESIZED_CROP), items)
    (from_leveldb,) = batches(records_of(leveldb_path, RANDOM_RESIZED_CROP, "leveldb"), items)
    assert torch.equal(from_lmdb.images, from_leveldb.images)


def test_a_batch_made_in_the_training_process_leaves_its_threads_as_they_were(tmp_path):
    """--num_workers 0: the batch is made with torch on one thread, the model then gets its own
    threads back (also when a record fails)."""
    path, _ = photo_db(str(tmp_path / "db"))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        batches(records_of(path, RANDOM_RESIZED_CROP), [[(0, 0), (1, 1)]])
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
