"""The launcher's wait for its training processes (launch/children.py) when they fail together.

A process that has closed its files makes its sentinel readable a moment before its exit status
can be collected; until then its `exitcode` reads None. Two processes failing together once fell
into that moment between two looks of the wait, which took them for a clean end: the launcher
exited 0 after its process's one error line (tests/system/test_namespaces.py, once in a dozen runs
on a loaded machine). That moment is the kernel's to time, so the processes here stand in for real
ones: real pipes as sentinels, readable at once, and an exit status that the waiter collects by
joining or finds after looking twice. torch's own ProcessContext reports the failure."""

from __future__ import annotations

import os

import pytest
from torch.multiprocessing import ProcessContext, ProcessExitedException

from resnet50_trainer.launch.children import wait_for


class EndedProcess:
    """A training process that has ended with `code` and closed its files."""

    def __init__(self, code: int, pid: int):
        self.sentinel, write = os.pipe()
        os.close(write)  # readable: the process closed its end
        self.code, self.pid, self.looks, self.joined = code, pid, 0, False

    @property
    def exitcode(self) -> int | None:
        self.looks += 1  # the kernel lets the waiter collect the status from its third look
        return self.code if self.joined or self.looks > 2 else None

    def join(self, timeout: float | None = None) -> None:
        self.joined = True

    def is_alive(self) -> bool:
        return self.exitcode is None

    def kill(self) -> None:
        raise AssertionError("an ended process is not killed")

    terminate = kill


@pytest.mark.parametrize("codes", [(2, 2), (0, 1), (1, 0)])
def test_processes_failing_together_are_never_taken_for_a_clean_end(tmp_path, codes):
    processes = [EndedProcess(code, 100 + index) for index, code in enumerate(codes)]
    context = ProcessContext(processes, [str(tmp_path / f"error_{i}") for i in range(2)])
    with pytest.raises(ProcessExitedException) as failure:
        wait_for(context)
    assert failure.value.exit_code == max(codes) and codes[failure.value.error_index]
    for process in processes:
        os.close(process.sentinel)


def test_processes_that_all_ended_cleanly_end_the_wait(tmp_path):
    processes = [EndedProcess(0, 100 + index) for index in range(2)]
    wait_for(ProcessContext(processes, [str(tmp_path / f"error_{i}") for i in range(2)]))
    for process in processes:
        os.close(process.sentinel)
