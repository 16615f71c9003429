"""--auto_resume: a run started again by its launcher (torchrun --max-restarts, a Slurm requeue, a
Kubernetes restart) with the same command continues from the newest usable checkpoint of its own
--checkpoint_dir and --save_model_name; with none there yet it starts as its flags say (a new run,
--init_model, or --load_model_path).

Which run the checkpoints there belong to is settled as for any resume: the lock and the lineage
(claim.py) refuse a directory that also holds another run's checkpoints. What the lineage
cannot tell, another run's checkpoints alone under this run's names, the settings do: a run
restarted with the same command has the same settings, so a checkpoint made with other ones is
refused rather than quietly continued."""

from __future__ import annotations

import logging
import os

from resnet50_trainer.checkpoint import files as checkpoint_files
from resnet50_trainer.config.settings import Config
from resnet50_trainer.errors import UserError
from resnet50_trainer.path_words import shown

log = logging.getLogger(__name__)
# Settings (by their flags' names) that may differ between starts of one run without making it
# another: where and how fast it runs, how long, what it logs and tests, how it starts and meets.
# Every other setting, a flag added later included, must be the checkpoint's.
MAY_DIFFER_ON_RESTART = frozenset(
    {
        *("gpus", "num_gpus", "use_cpu", "model_parallel", "pipeline_chunks"),
        *("num_shards", "shard_id", "run_id", "redis_host", "redis_port", "redis_password"),
        *("file_store_path", "distributed_transport", "distributed_interfaces"),
        *("first_iter_timeout", "timeout", "num_workers", "compile", "decode_device"),
        *("read_order", "read_window_mb"),  # a mid-epoch checkpoint's epoch keeps its order
        *("cudnn_workspace_limit_mb", "enable_tensor_core", "num_epochs", "max_bad_records"),
        *("log_dir", "checkpoint_dir", "print_every", "profile_iters", "log_top5"),
        *("keep_checkpoints", "checkpoint_every_iters", "test_data", "test_epoch_size"),
        *("load_model_path", "init_model", "test_only", "auto_resume"),
    }
)


def resume_path(config: Config) -> str | None:
    """The checkpoint, or directory of checkpoints, this run continues; None for a new run. With
    --auto_resume this run's own checkpoint directory, when it holds a checkpoint of this name,
    wins over --load_model_path: a restart continues where the run got to, not where it began."""
    if config.auto_resume and holds_checkpoints(config.checkpoint_dir, config.save_model_name):
        return config.checkpoint_dir
    return config.load_model_path


def holds_checkpoints(directory: str, name: str) -> bool:
    """Complete checkpoints of `name` (temporary files of a killed writer are none)."""
    if not os.path.isdir(directory):
        return False
    try:
        return bool(checkpoint_files.saved_checkpoints(directory, name))
    except OSError as error:
        raise UserError(
            f"--auto_resume cannot list --checkpoint_dir {shown(directory)} ({error.strerror}): "
            "make it readable on every machine, or choose another"
        ) from None


def say_how_it_starts(config: Config) -> None:
    """One line on what --auto_resume found, so a restart's log tells a resume from a new start."""
    if not config.auto_resume:
        return
    if holds_checkpoints(config.checkpoint_dir, config.save_model_name):
        found = "continuing this run from its newest usable checkpoint there"
    else:
        start = (
            f"continuing --load_model_path {config.load_model_path}"
            if config.load_model_path
            else f"starting from --init_model {config.init_model}"
            if config.init_model
            else "a new run"
        )
        found = (
            f"no checkpoint {config.save_model_name}_*{checkpoint_files.SUFFIX} there yet: {start}"
        )
    log.info("--auto_resume in %s: %s", config.checkpoint_dir, found)


def check_same_run(state: dict, config: Config) -> None:
    """A checkpoint --auto_resume chose was made with this run's settings, or it is another run's
    (or this run's command changed) and is not continued silently."""
    if not config.auto_resume or not holds_checkpoints(
        config.checkpoint_dir, config.save_model_name
    ):
        return
    saved, ours = state["arguments"], config.to_dict()
    # A checkpoint of an earlier version lacks the settings added since: those are not compared.
    for flag in sorted(ours.keys() & saved.keys() - MAY_DIFFER_ON_RESTART):
        if not _same(saved[flag], ours[flag]):
            raise UserError(
                f"--auto_resume found {state['path']}, made with --{flag} "
                f"{_shown(saved[flag])}, and this run has --{flag} {_shown(ours[flag])}: it "
                "is another run's checkpoint, or this run's command changed; give this run "
                "another --checkpoint_dir or --save_model_name, or continue that checkpoint "
                "deliberately with --load_model_path (without --auto_resume)"
            )


def _same(saved: object, ours: object) -> bool:
    """Equal values (0 and 0.0 alike); a crafted checkpoint's tensor, or anything else that does
    not compare to a plain True, is another value."""
    try:
        same = saved == ours
    except Exception:  # e.g. a tensor of several values inside a list: no answer, so not the same
        return False
    return same is True


def _shown(value: object) -> str:
    """A setting as the command line writes it; a crafted one cut short, never a control
    character in the line."""
    if isinstance(value, list):
        text = ",".join(str(item) for item in value)
    else:
        text = "(none)" if value is None else str(value)
    return text if len(text) <= 80 and text.isprintable() else repr(text[:80])
