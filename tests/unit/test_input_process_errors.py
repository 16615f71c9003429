"""How input processes start, and what they report of their own errors (data/input_pipeline.py).

They are forked from their training process, however that one started: a training process of
our launcher is forked from its fork server, which makes forkserver multiprocessing's default
there (spawn did the same), and each input process was once started afresh that way.

A training process killed while an input process hands it a batch breaks the connection inside
multiprocessing's resource sharer, the input process's thread that passes the batch's shared
memory; the sharer reported that through sys.excepthook as a traceback beside the run's two lines
(tests/system/test_fault_output.py, once, on a loaded machine). Here the real sharer, and a
receiver that goes away mid-handshake."""

from __future__ import annotations

import multiprocessing.context
import os
import socket
import sys
from multiprocessing import resource_sharer

from resnet50_trainer.data.cpu_decode import CpuDecode
from resnet50_trainer.data.dataset import ImageRecords
from resnet50_trainer.data.formats.databases import read_keys
from resnet50_trainer.data.input_pipeline import make_loader, quiet_when_the_receiver_is_gone
from resnet50_trainer.train.inputs import input_settings
from tests.support.dbfactory import write_image_db
from tests.support.trainer_runs import SMALL_RUN, config_of, wait_for


def test_input_processes_are_forked_whatever_multiprocessing_s_default(tmp_path, monkeypatch):
    monkeypatch.setattr(multiprocessing.context, "_default_context", ForkServerDefault())
    db = write_image_db(str(tmp_path / "db"), 4, 2)
    settings = input_settings(config_of(*SMALL_RUN, "--train_data", db), train=False)
    records = ImageRecords(db, "lmdb", read_keys(db, "lmdb"), settings, False, CpuDecode(settings))
    loader = make_loader(records, [[0, 1], [2, 3]], 1, False)
    assert loader.multiprocessing_context.get_start_method() == "fork"
    assert [len(batch.labels) for batch in loader] == [2, 2]


class ForkServerDefault(multiprocessing.context.DefaultContext):
    """multiprocessing's default in a process the fork server started."""

    def __init__(self):
        super().__init__(multiprocessing.get_context("forkserver"))


def test_a_receiver_gone_mid_handover_leaves_no_traceback(monkeypatch):
    reported: list[type] = []
    reached: list[type] = []
    quiet = quiet_when_the_receiver_is_gone(lambda kind, value, tb: reported.append(kind))

    def excepthook(kind, value, tb) -> None:
        reached.append(kind)
        quiet(kind, value, tb)

    monkeypatch.setattr(sys, "excepthook", excepthook)
    read_end, write_end = os.pipe()
    try:
        resource_sharer.DupFd(read_end)  # the sharer starts, as for a batch handed over
        receiver = socket.socket(socket.AF_UNIX)
        receiver.connect(resource_sharer._resource_sharer._address)  # type: ignore[attr-defined]
        receiver.close()  # before the sharer's challenge is answered: a receiver killed
        wait_for(lambda: bool(reached), 30, "the sharer to find its receiver gone")
    finally:
        resource_sharer.stop()
        os.close(read_end)
        os.close(write_end)
    assert issubclass(reached[0], (ConnectionError, EOFError)), reached
    assert reported == []


def test_any_other_error_of_an_input_process_keeps_its_traceback():
    reported: list[type] = []
    quiet = quiet_when_the_receiver_is_gone(lambda kind, value, tb: reported.append(kind))
    for error in (ConnectionResetError("elsewhere"), ValueError("a bug")):
        try:
            raise error
        except Exception:
            quiet(*sys.exc_info())
    assert reported == [ConnectionResetError, ValueError]
