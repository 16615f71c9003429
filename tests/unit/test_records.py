"""Record parsing, building and decoding: Caffe Datum and Caffe2 TensorProtos."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from resnet50_trainer.data.formats.images import (
    decode_image,
    decode_jpeg_reduced,
    decode_native,
    gray_pixels,
    jpeg_header,
    jpeg_reduction,
)
from resnet50_trainer.data.formats.records import (
    DATUM,
    TENSORPROTOS,
    Record,
    parse_record,
    serialize_record,
)
from resnet50_trainer.errors import RecordError
from tests.support.dbfactory import (
    datum_record,
    encode_image,
    encoded_of,
    make_jpeg,
    pixels_of,
    random_pixels,
    tensorprotos_record,
)

# Two pixels: pure red, pure blue, as RGB
RED_BLUE = np.array([[[255, 0, 0], [0, 0, 255]]], dtype=np.uint8)


def test_wire_bytes_of_a_raw_datum_parse_with_caffe_field_numbers():
    # Written by hand from caffe.proto: channels=1 (0x08), height=2 (0x10), width=3 (0x18),
    # data=4 (0x22, length 2), label=5 (0x28).
    value = b"\x08\x01\x10\x01\x18\x02\x22\x02\xaa\xbb\x28\x07"
    record = parse_record(value)
    assert (record.label, record.format, record.is_encoded) == (7, DATUM, False)
    assert pixels_of(record).shape == (1, 2, 1)
    assert pixels_of(record).ravel().tolist() == [0xAA, 0xBB]


def test_wire_bytes_of_a_tensorprotos_parse_with_caffe2_field_numbers():
    # TensorProtos.protos=1; TensorProto dims=1, data_type=2 (STRING 4, INT32 2), int32_data=4
    # (packed), string_data=6.
    image = b"\x08\x01\x10\x04\x32\x03abc"
    label = b"\x08\x01\x10\x02\x22\x01\x05"
    value = b"\x0a" + bytes([len(image)]) + image + b"\x0a" + bytes([len(label)]) + label
    record = parse_record(value)
    assert (record.label, record.format, record.encoded) == (5, TENSORPROTOS, b"abc")


@pytest.mark.parametrize(
    "build",
    [
        lambda pixels: datum_record(3, pixels),
        lambda pixels: datum_record(3, pixels, as_float=True),
        lambda pixels: tensorprotos_record(3, pixels),
        lambda pixels: tensorprotos_record(3, pixels, as_float=True, bbox=[1, 2, 3, 4]),
    ],
    ids=["datum-bytes", "datum-float", "tensorprotos-byte", "tensorprotos-float-bbox"],
)
@pytest.mark.parametrize("channels", [3, 1])
def test_raw_records_give_back_the_stored_pixels_in_rgb(build, channels):
    pixels = random_pixels(5, 7, channels, seed=channels)
    record = parse_record(build(pixels))
    assert record.label == 3
    np.testing.assert_array_equal(record.pixels, pixels)


def test_bgr_storage_is_swapped_to_rgb():
    stored = np.frombuffer(pixels_of(parse_record(datum_record(0, RED_BLUE))).tobytes(), np.uint8)
    assert stored.tolist() == [255, 0, 0, 0, 0, 255]
    datum_bytes = datum_record(0, RED_BLUE)
    assert b"\x00\xff\x00\x00\xff\x00" in datum_bytes  # CHW BGR: B plane, G plane, R plane


def test_float_values_are_rounded_and_clipped():
    from resnet50_trainer.data.formats import protos

    message = protos.TensorProtos()
    image = message.protos.add(data_type=protos.FLOAT, dims=[1, 1, 3])
    image.float_data.extend([-5.0, 100.4, 300.0])
    message.protos.add(data_type=protos.INT32, dims=[1], int32_data=[2])
    assert pixels_of(parse_record(message.SerializeToString())).ravel().tolist() == [0, 100, 255]


@pytest.mark.parametrize("build", [datum_record, tensorprotos_record])
def test_encoded_records_decode_exactly_as_pillow_decodes_the_bytes(build):
    jpeg = make_jpeg(24, 40)
    record = parse_record(build(9, encoded=jpeg))
    assert (record.label, record.encoded) == (9, jpeg)
    expected = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"))
    np.testing.assert_array_equal(np.asarray(decode_image(record, 3)), expected)


@pytest.mark.parametrize(
    "value, message",
    [
        (b"", "empty record"),
        (b"\xff\xfe\xfd garbage", "neither a Caffe Datum"),
        (datum_record(1, np.zeros((0, 4, 3), np.uint8)), "zero-size"),
        (datum_record(1, random_pixels(2, 2, 4)), "4 channels"),
        (tensorprotos_record(1, encoded=b"x")[:9], "expected an image tensor"),
    ],
)
def test_malformed_records_raise_one_line_record_errors(value, message):
    with pytest.raises(RecordError, match=message) as caught:
        parse_record(value)
    assert "\n" not in str(caught.value)


def test_a_size_mismatch_names_both_sizes():
    from resnet50_trainer.data.formats import protos

    value = protos.Datum(channels=3, height=4, width=4, data=b"\x00" * 47).SerializeToString()
    with pytest.raises(RecordError, match="holds 47 values but its shape .* needs 48"):
        parse_record(value)


def test_truncated_jpeg_fails_when_decoded():
    record = parse_record(datum_record(0, encoded=make_jpeg(32, 32)[:-200]))
    with pytest.raises(RecordError, match="cannot decode"):
        decode_image(record, 3)
    with pytest.raises(RecordError, match="no format Pillow can read"):
        decode_image(parse_record(datum_record(0, encoded=b"not an image")), 3)


def test_channel_conversion_both_ways():
    gray = parse_record(datum_record(0, random_pixels(4, 6, 1)))
    colour = parse_record(datum_record(0, random_pixels(4, 6, 3)))
    assert decode_native(gray).mode == "L" and decode_native(colour).mode == "RGB"
    as_rgb = np.asarray(decode_image(gray, 3))
    assert as_rgb.shape == (4, 6, 3) and (as_rgb[:, :, 0] == pixels_of(gray)[:, :, 0]).all()
    assert decode_image(colour, 1).mode == "L"
    rgba_png = encode_image(
        np.dstack([random_pixels(4, 6, 3), np.full((4, 6), 9, np.uint8)]), "PNG"
    )
    assert decode_image(parse_record(datum_record(0, encoded=rgba_png)), 3).mode == "RGB"
    with pytest.raises(RecordError, match="num_channels"):
        decode_image(colour, 2)


def test_jpeg_draft_scales_down_but_keeps_the_requested_size():
    record = parse_record(datum_record(0, encoded=make_jpeg(192, 256)))
    full = decode_image(record, 3)
    drafted = decode_image(record, 3, draft_size=(64, 64))
    assert full.size == (256, 192)
    assert drafted.size == (128, 96)  # 1/2 scale; 1/4 would make the height 48 < 64
    assert decode_image(record, 3, draft_size=(200, 200)).size == (256, 192)


def test_libjpeg_turbo_decode_scales_by_powers_of_two_keeping_the_shorter_side():
    record = parse_record(datum_record(0, encoded=make_jpeg(200, 300)))
    frame = jpeg_header(record.encoded)
    assert frame is not None

    def decoded_shape(min_side):
        reduction = jpeg_reduction(min(frame.size), min_side)
        return decode_jpeg_reduced(encoded_of(record), frame.size, reduction).shape

    assert decoded_shape(40) == (50, 75, 3)  # 1/4; 1/8 would make the height 25 < 40
    assert decoded_shape(100) == (100, 150, 3)  # 1/2, the height exactly 100
    # Between 1x and 2x the target: full size, not 6/8 (slower than a full decode, see BENCHMARKS)
    assert decoded_shape(120) == decoded_shape(200) == (200, 300, 3)
    # At full size it is the same libjpeg-turbo decode as Pillow's, to the pixel.
    np.testing.assert_array_equal(
        decode_jpeg_reduced(encoded_of(record), (300, 200), 1), np.asarray(decode_image(record, 3))
    )


def test_libjpeg_turbo_decode_reads_gray_jpegs_and_refuses_truncated_ones():
    gray = parse_record(datum_record(0, encoded=make_jpeg(64, 48, channels=1)))
    frame = jpeg_header(gray.encoded)
    assert frame is not None
    as_rgb = decode_jpeg_reduced(encoded_of(gray), frame.size, 2)
    assert as_rgb.shape == (32, 24, 3)
    assert (as_rgb[:, :, 0] == as_rgb[:, :, 1]).all() and (as_rgb[:, :, 1] == as_rgb[:, :, 2]).all()
    np.testing.assert_array_equal(
        gray_pixels(decode_jpeg_reduced(encoded_of(gray), (48, 64), 1))[:, :, 0],
        np.asarray(decode_image(gray, 1)),
    )
    truncated = make_jpeg(64, 64)[:-200]
    with pytest.raises(RecordError, match="cannot decode"):
        decode_jpeg_reduced(truncated, (64, 64), 4)


@pytest.mark.parametrize(
    "record_format, builder", [(DATUM, datum_record), (TENSORPROTOS, tensorprotos_record)]
)
@pytest.mark.parametrize("channels", [3, 1])
def test_serialized_records_match_the_original_tools_layout(record_format, builder, channels):
    pixels = random_pixels(3, 5, channels, seed=4)
    raw = Record(label=6, encoded=None, pixels=pixels, format=record_format)
    assert serialize_record(raw) == builder(6, pixels)
    jpeg = make_jpeg(8, 8)
    encoded = Record(label=6, encoded=jpeg, pixels=None, format=record_format)
    assert serialize_record(encoded) == builder(6, encoded=jpeg)
