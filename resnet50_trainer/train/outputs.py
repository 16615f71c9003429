"""Where a run reports, as one object: the first process's run log and --tensorboard's event files
(None on the others), the GPUs' utilisation on the progress bar, and the profiler, whose steps
every process counts. Opened together (a refusal of either log stops every process) and closed
together."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from resnet50_trainer.config.settings import Config
from resnet50_trainer.distributed import process_group
from resnet50_trainer.distributed.devices import replica_devices
from resnet50_trainer.distributed.process_group import Placement
from resnet50_trainer.distributed.stopping import on_first_process, stop_together
from resnet50_trainer.errors import UserError
from resnet50_trainer.reporting.gpu_monitor import GpuMonitor
from resnet50_trainer.reporting.profiling import StepProfiler
from resnet50_trainer.reporting.runlog import RunLog
from resnet50_trainer.reporting.tensorboard import TensorBoardLog, event_directory


@dataclass
class Outputs:
    config: Config
    device: torch.device  # this process's, where the profile's end is agreed
    runlog: RunLog | None
    gpu_monitor: GpuMonitor | None
    profiler: StepProfiler
    tensorboard: TensorBoardLog | None = None

    @classmethod
    def open(
        cls,
        config: Config,
        placement: Placement,
        device: torch.device,
        started: float,
        lineage: str,
        iteration: int,
        steps_left: int,
    ) -> Outputs:
        """The first process's new run log and --tensorboard's writer (if either cannot be made,
        all stop), the trace beside it and the GPU monitor; every process counts its steps for the
        profiler (of the `steps_left` in the run). `lineage`, `iteration`: the run's, where
        TensorBoard's curves go on from."""

        def open_logs() -> tuple[RunLog, TensorBoardLog | None]:
            runlog = RunLog(config, started)
            if not config.tensorboard:
                return runlog, None
            try:
                return runlog, TensorBoardLog(event_directory(config, lineage), iteration)
            except UserError:
                runlog.discard()  # a refused run leaves no log of a header alone
                raise

        runlog, tensorboard = on_first_process(
            open_logs, placement, device, "the first process's report on its writes"
        ) or (None, None)
        devices = (
            replica_devices(config, placement.local_rank) if config.model_parallel else (device,)
        )
        return cls(
            config,
            device,
            runlog,
            GpuMonitor(list(dict.fromkeys(config.gpus))).start() if runlog else None,
            StepProfiler(
                config.profile_iters, runlog.path if runlog else None, devices, steps_left
            ),
            tensorboard,
        )

    def profile_step(self) -> None:
        """After each step (the profiler starts and ends by itself)."""
        if self.profiler.step():
            self._profile_written()

    def close(self) -> None:
        """At the run's end: a profile still open (the run was shorter) written, the monitor
        stopped, the logs closed."""
        if self.profiler.close():
            self._profile_written()
        if self.gpu_monitor:
            self.gpu_monitor.stop()
        if self.tensorboard:
            self.tensorboard.close()
        if self.runlog:
            self.runlog.close()

    def _profile_written(self) -> None:
        """Every process, once the profile has ended: the others wait while the first writes it
        (seconds, a minute for a long one on a GPU), as at a checkpoint up to
        --first_iter_timeout, and all stop together if it could not be written."""
        with process_group.long_wait(self.config):
            stop_together(
                self.profiler.failure, self.device, "the first process's writing of the profile"
            )
