"""The spans a run marks in a profile's trace (torch.profiler's record_function), so that a trace
says when the training process waited for its input and what it did to bring a batch onto the
device, and which of its time went to work between steps (an epoch's evaluation, a checkpoint);
reporting/trace_host.py and reporting/trace_kernels.py read them by these names."""

from __future__ import annotations

WAIT_FOR_BATCH = "input: wait for a batch"  # from the input processes (or made in this one)
COPY_TO_DEVICE = "input: copy to the device"  # the pinned batch, queued on the side stream
DECODE_ON_GPU = "input: decode on the GPU"  # nvJPEG, then the crops resized there
EVALUATION = "evaluation"  # the test DB's pass after an epoch (train/epoch_loop.py)
CHECKPOINT = "checkpoint"  # a checkpoint's save, at an epoch's end or within one
