"""A run whose loss or weights stop being finite: noticed without a per-step device read, and
reported in one line naming where it happened and which checkpoint to resume from."""

from __future__ import annotations

import torch
import torch.distributed as dist

from resnet50_trainer.checkpoint import files as checkpoint_files
from resnet50_trainer.config.settings import Config
from resnet50_trainer.distributed import process_group
from resnet50_trainer.errors import Diverged
from resnet50_trainer.model.finite import finite_by_device

NO_BAD_LOSS = torch.iinfo(torch.int64).max  # the watch's "no non-finite loss yet"


class DivergenceWatch:
    """Notices a loss or weight that is no longer finite without reading the device per step.

    Each step folds "is this loss finite" into a device-side first-bad-iteration (no sync); check()
    all-reduces that with "are the weights finite" and reads the result once. Every process calls
    it at the same steps and gets the same answer, so a diverged run stops everywhere at once.
    A float16 step that the gradient scaler skips has a finite loss and leaves the weights as they
    were: it passes."""

    def __init__(self, model: torch.nn.Module, loss_device: torch.device, device: torch.device):
        self.parameters = [parameter.detach() for parameter in model.parameters()]
        self.device = device  # collectives run on this process's own device
        self.first_bad_loss = torch.full((), NO_BAD_LOSS, dtype=torch.int64, device=loss_device)

    def record(self, loss: torch.Tensor, iteration: int) -> None:
        bad_here = torch.where(loss.detach().isfinite(), NO_BAD_LOSS, iteration)
        torch.minimum(self.first_bad_loss, bad_here, out=self.first_bad_loss)

    def check(
        self, stop_signalled: bool = False, pause_asked: bool = False
    ) -> tuple[int | None, bool, bool, bool]:
        """(the first global iteration whose loss was not finite on any process, or None; whether
        every weight is finite; whether a stop signal reached any process, `stop_signalled` here;
        whether Ctrl-Z did, `pause_asked` here). One small all-reduce and one read."""
        verdict = torch.stack(
            [
                self.first_bad_loss.to(self.device),
                self.weights_finite().to(self.device, torch.int64),
                *(
                    torch.full((), 0 if asked else 1, dtype=torch.int64, device=self.device)
                    for asked in (stop_signalled, pause_asked)
                ),
            ]
        )
        with process_group.waiting_for_peers("the divergence check"):
            dist.all_reduce(verdict, op=dist.ReduceOp.MIN)
            first_bad_loss, weights_finite, none_signalled, none_paused = verdict.tolist()
        return (
            None if first_bad_loss == NO_BAD_LOSS else first_bad_loss,
            bool(weights_finite),
            not none_signalled,
            not none_paused,
        )

    def weights_finite(self) -> torch.Tensor:
        """The 2-norm of each weight (the clip_grad_norm_ kernel), not the max-abs one: a NaN or
        inf weight makes it NaN or inf, and so do finite weights whose squares overflow float32
        (around 1e16 to 1e19), a run as lost as one with NaNs."""
        finite = [
            group.all().to(self.device) for _, group in finite_by_device(self.parameters, 2.0)
        ]
        return torch.stack(finite).all()


def divergence_report(
    first_bad_loss: int | None, iteration: int, steps_per_epoch: int, config: Config
) -> Diverged:
    """The line for a diverged run (the first process's: it reads the checkpoint directory):
    where it diverged, and the last good checkpoint to resume from."""
    if first_bad_loss is not None:
        what = (
            "the loss was no longer finite (inf or nan) at "
            f"{_position(first_bad_loss, steps_per_epoch)}"
        )
    else:
        what = (
            "the weights were no longer finite (inf, nan, or too large to square in float32) "
            f"by {_position(iteration, steps_per_epoch)}"
        )
    saved = checkpoint_files.saved_checkpoints(config.checkpoint_dir, config.save_model_name)
    # The newest checkpoint of this run's directory, else the one this run started from.
    last_good, resume_from = (
        (saved[-1].path, config.checkpoint_dir)
        if saved
        else (config.load_model_path, config.load_model_path)
    )
    fix = "lower --base_learning_rate or add --warmup_epochs"
    advice = (
        f"the last good checkpoint {last_good} is kept: {fix}, then resume with "
        f"--load_model_path {resume_from}"
        if last_good
        else f"no checkpoint was written: {fix} and start again"
    )
    return Diverged(f"training diverged: {what}; {advice}")


def _position(iteration: int, steps_per_epoch: int) -> str:
    epoch, step = divmod(iteration - 1, steps_per_epoch)
    return f"iteration {iteration} (epoch {epoch + 1}, step {step + 1})"
