"""Whose checkpoints these are: the lineage a resumed run continues, the lineage a checkpoint file
carries (read cheaply), another run's checkpoints under this name, and the retention that deletes
only this run's older ones."""

from __future__ import annotations

import logging
import os
import uuid

from resnet50_trainer.checkpoint.files import (
    Saved,
    load_weights_file,
    saved_checkpoints,
)
from resnet50_trainer.checkpoint.schema import REQUIRED_KEYS, UNMARKED_LINEAGE

log = logging.getLogger(__name__)


def lineage_of(state: dict, checkpoint_dir: str) -> str:
    """The lineage a run resumed from `state` continues. A checkpoint written before lineages
    existed continues the unmarked checkpoints of its own directory when resumed there (the same
    old run, in place); resumed into another directory, its unmarked files there are another
    run's, so it takes a lineage of its own, derived from its path (every process derives the
    same)."""
    if "lineage" in state:
        return state["lineage"]
    own_directory = os.path.dirname(os.path.abspath(state["path"]))
    if os.path.exists(checkpoint_dir) and os.path.samefile(own_directory, checkpoint_dir):
        return UNMARKED_LINEAGE
    return uuid.uuid5(uuid.NAMESPACE_URL, os.path.realpath(state["path"])).hex


def read_lineage(path: str) -> str | None:
    """The lineage of the checkpoint at `path`, or None when it is no readable checkpoint. Cheap:
    with mmap the tensors are mapped, not read."""
    try:
        state = load_weights_file(path, mmap=True)
    except Exception:  # whatever is wrong with the file, it is no checkpoint we can attribute
        return None
    if not isinstance(state, dict) or REQUIRED_KEYS - state.keys():
        return None
    lineage = state.get("lineage", UNMARKED_LINEAGE)
    return lineage if isinstance(lineage, str) else None


def checkpoints_of_other_runs(directory: str, name: str, lineage: str | None) -> list[Saved]:
    """This name's complete checkpoints in `directory` not of `lineage`; all of them for a fresh
    run (lineage None). For a resumed run a file that cannot be read is not counted: it may be
    the damaged newest one the resume skipped, and no run can continue from it."""
    return [
        saved
        for saved in saved_checkpoints(directory, name)
        if lineage is None or read_lineage(saved.path) not in (lineage, None)
    ]


def remove_older(directory: str, name: str, keep: int, lineage: str, written: str) -> None:
    """Keep `keep` checkpoints of this run's lineage, `written` (just in place) counted as the
    newest, and delete the rest of that lineage. Another run's checkpoints, and files that
    cannot be read, are never deleted. A deletion that fails is warned of: the run has its
    checkpoint."""
    ours = [
        saved.path
        for saved in saved_checkpoints(directory, name)
        if os.path.basename(saved.path) != os.path.basename(written)
        and read_lineage(saved.path) == lineage
    ]
    for path in ours[: max(0, len(ours) - (keep - 1))]:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as error:
            log.warning(
                "Could not delete the older checkpoint %s (%s): delete it yourself",
                path,
                error.strerror,
            )
