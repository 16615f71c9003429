"""A run's claim on its checkpoints, checked before any training process starts: names that fit the
file system, the lock a second live run is refused by, no other run's checkpoints under these
names, and a checkpoint to resume that fits this run's model."""

from __future__ import annotations

import errno
import os

from resnet50_trainer.checkpoint import files as checkpoint_files
from resnet50_trainer.checkpoint import grad_compression_entry, ownership, schema
from resnet50_trainer.checkpoint.lock import CheckpointLock, lock_checkpoints
from resnet50_trainer.config.settings import Config
from resnet50_trainer.errors import UserError
from resnet50_trainer.path_words import shown

# A step count within an epoch that no run reaches (10^12 steps), for the longest checkpoint name.
LARGEST_STEP = 10**12


def check_checkpoint(state: dict, config: Config) -> None:
    """The checkpoint `state` is of this run's model: architecture, labels, tensor shapes."""
    schema.check_matches(state, config)
    # Here, not at the top: the model's code imports torchvision (and with it dynamo, ~2 s of
    # CPU), which the launcher of several processes needs for nothing else (launch/processes.py).
    from resnet50_trainer.model.optim import OptimizerSettings, build_optimizer
    from resnet50_trainer.model.resnet import model_shapes

    model = model_shapes(config)
    optimizer = None if config.test_only else build_optimizer(model, OptimizerSettings.of(config))
    schema.check_fits(state, model, optimizer)
    grad_compression_entry.check_fits(state, model, config)


def check_checkpoint_name(name: str) -> None:
    """A name that is no plain file name would write elsewhere, or fail after an epoch."""
    separators = {separator for separator in ("/", os.sep, os.altsep) if separator is not None}
    problems = (
        (not name, "is empty"),
        (any(separator in name for separator in separators), "has a directory part"),
        ("\0" in name, "holds a NUL character"),
        (any(not character.isprintable() for character in name), "holds a control character"),
        (
            name.startswith(checkpoint_files.TEMPORARY_PREFIX),
            f"starts with {checkpoint_files.TEMPORARY_PREFIX}, which marks temporary files",
        ),
        # "." and ".." would name hidden files ("._1.pt", ".._1.pt").
        (name.startswith("."), "starts with '.', which hides files"),
    )
    problem = next((problem for found, problem in problems if found), None)
    if problem:
        raise UserError(
            f"--save_model_name {_shown(name)} {problem}: give a plain file name "
            "stem, and the directory as --checkpoint_dir"
        )


def _check_checkpoint_names_fit(config: Config) -> None:
    """Create and delete a file of the longest name the run writes (a temporary file's, with a
    step count no epoch reaches): a name too long for the file system fails here, not after an
    epoch. The probe's random part holds a capital letter, which mkstemp never writes: no run's
    clean-up of temporary files takes it for one, and its process id sets it apart."""
    longest = checkpoint_files.temporary_name(
        config.save_model_name, config.num_epochs, LARGEST_STEP, f"P{os.getpid() % 10**7:07d}"
    )
    probe = os.path.join(config.checkpoint_dir, longest)
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(probe)
    except OSError as error:
        fix = (
            "choose a shorter name"
            if error.errno == errno.ENAMETOOLONG
            else "make --checkpoint_dir writable, with room for a file, or choose another"
        )
        raise UserError(
            f"--save_model_name {_shown(config.save_model_name)} cannot name "
            f"checkpoints in --checkpoint_dir {shown(config.checkpoint_dir)} "
            f"({error.strerror}): {fix}"
        ) from None


def claim_checkpoint_names(config: Config, resumed: dict | None) -> CheckpointLock:
    """This run's checkpoint names are its own: take their lock (a second live run refuses), make
    sure no other run's checkpoints carry them (a fresh run: none at all of this name; a resumed
    one: none of another lineage), then clear the temporary files killed writers left."""
    directory, name = config.checkpoint_dir, config.save_model_name
    _check_checkpoint_names_fit(config)
    lock = lock_checkpoints(directory, name)
    try:
        lineage = None if resumed is None else ownership.lineage_of(resumed, directory)
        others = ownership.checkpoints_of_other_runs(directory, name, lineage)
        if others:
            whose = "another run" if resumed is None else f"another run than {resumed['path']}'s"
            raise UserError(
                f"--checkpoint_dir {shown(directory)} holds checkpoints of {whose} (newest: "
                f"{others[-1].path}), which this run would replace or delete: resume "
                f"that run with --load_model_path {shown(directory)}, or give this run "
                "another --checkpoint_dir or --save_model_name"
            )
        checkpoint_files.remove_temporary_files(directory, name)
    except BaseException:
        lock.release()
        raise
    return lock


def _shown(name: str) -> str:
    return repr(name) if len(name) <= 60 else f"{name[:40]!r}... ({len(name)} characters)"
