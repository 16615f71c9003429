"""What an input process reports of its own errors (data/input_pipeline.py).

A training process killed while an input process hands it a batch breaks the connection inside
multiprocessing's resource sharer, the input process's thread that passes the batch's shared
memory; the sharer reported that through sys.excepthook as a traceback beside the run's two lines
(tests/system/test_fault_output.py, once, on a loaded machine). Here the real sharer, and a
receiver that goes away mid-handshake."""

from __future__ import annotations

import os
import socket
import sys
from multiprocessing import resource_sharer

from resnet50_trainer.data.input_pipeline import quiet_when_the_receiver_is_gone
from tests.support.trainer_runs import wait_for


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
