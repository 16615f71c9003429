"""Where records become pixels: whatever a decoder raises is the record's failure."""

from __future__ import annotations

import pytest
from PIL import Image

from dbfactory import datum_record, make_jpeg
from resnet50_trainer.data.formats.images import decode_image
from resnet50_trainer.data.formats.records import parse_record
from resnet50_trainer.errors import RecordError


def test_any_error_of_a_decoder_is_the_records_failure(monkeypatch):
    """Pillow's plugins raise many kinds on hostile bytes (KeyError, struct.error, ...)."""

    def broken_open(*_):
        raise KeyError(6)

    monkeypatch.setattr(Image, "open", broken_open)
    record = parse_record(datum_record(0, encoded=make_jpeg()))
    with pytest.raises(RecordError, match=r"cannot decode the record's image bytes \(KeyError"):
        decode_image(record, 3)
