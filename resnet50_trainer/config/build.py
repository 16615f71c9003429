"""The command line's flags built into the run's Config, one pipeline, torch-free: --recipe and
--solver beneath the flags given, the launcher's placement adopted, the settings worked out from
the flags and the machine (GPU ids, processes, defaults that depend on others, the run id), then
every flag group's checks. The machine itself is looked at afterwards (launch/probes.py)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

from resnet50_trainer.config.checks import check_settings
from resnet50_trainer.config.cores import cores_per_process
from resnet50_trainer.config.flags.parser import RUN_ID_PATTERN, build_parser, given_flags
from resnet50_trainer.config.gpu_ids import select_gpus
from resnet50_trainer.config.launchers import Launched, gpus_the_machine_holds
from resnet50_trainer.config.recipes import RECIPES, with_fitted, with_recipe
from resnet50_trainer.config.settings import (
    SYNTHETIC_DATA,
    SYNTHETIC_EPOCH_SIZE,
    Config,
)
from resnet50_trainer.config.solver import with_solver
from resnet50_trainer.data.settings import default_scale
from resnet50_trainer.errors import UserError


def build_config(
    args: argparse.Namespace, gpus_present: int, launched: Launched | None = None
) -> Config:
    """The run's settings from the parsed flags: the launcher's placement adopted, the derived
    settings worked out, then checked against each other (checks.check_settings); UserError on
    the first problem.

    `launched`: the torchrun/srun/mpirun that started this process, whose placement wins."""
    if launched is not None:
        args = adopt_launcher(args, launched)
        gpus_present = gpus_the_machine_holds(
            launched, gpus_present, args.model_parallel, os.environ
        )
    # Each flag's value is its setting, but for the few worked out from the flags and the machine.
    config = Config(**{**vars(args), **derived_settings(args, gpus_present, launched)})
    check_settings(config)
    return config


def derived_settings(
    args: argparse.Namespace, gpus_present: int, launched: Launched | None
) -> dict[str, Any]:
    """The settings that are not a flag's value as given: the GPU ids and processes of this machine,
    the defaults that depend on other settings, and the run id."""
    gpu_ids, num_processes = _devices_of_this_machine(args, gpus_present)
    return {
        "gpus": gpu_ids,
        "processes_per_machine": num_processes,
        "scale": args.scale or default_scale(args.image_size),
        "num_workers": (
            _default_workers(num_processes) if args.num_workers is None else args.num_workers
        ),
        "checkpoint_dir": args.checkpoint_dir or args.log_dir,
        "run_id": run_id_of(args, launched),
    }


def _devices_of_this_machine(
    args: argparse.Namespace, gpus_present: int
) -> tuple[tuple[int, ...], int]:
    """The GPU ids this machine trains on (none with --use_cpu) and its training processes, one a
    replica."""
    gpu_ids = select_gpus(
        args.gpus, args.processes_per_machine, args.use_cpu, args.model_parallel, gpus_present
    )
    per_replica = 2 if args.model_parallel else 1
    num_processes = len(gpu_ids) // per_replica if gpu_ids else (args.processes_per_machine or 1)
    return tuple(gpu_ids), num_processes


def adopt_launcher(args: argparse.Namespace, launched: Launched) -> argparse.Namespace:
    """A copy of the flags with the machines and this machine's index taken from the launcher: a
    machine is a shard, --batch_size stays the total of one machine. Two forms: the launcher starts
    one process per GPU (--num_gpus left out), or, the original's way, one rank per machine that
    starts --num_gpus processes itself (launch/processes.py), as a run without a launcher does."""
    if args.num_shards not in (1, launched.num_machines) or args.shard_id not in (
        0,
        launched.machine_index,
    ):
        raise UserError(
            f"{launched.name} places this process on machine "
            f"{launched.machine_index} of {launched.num_machines}, but "
            "--num_shards/--shard_id say otherwise: leave them out"
        )
    asked = _replicas_asked_for(args)
    _check_one_form(launched, asked)
    _check_a_way_to_meet(args, launched)
    adopted = argparse.Namespace(**vars(args))
    adopted.num_shards, adopted.shard_id = launched.num_machines, launched.machine_index
    if asked is None:
        adopted.processes_per_machine = launched.local_world_size
    return adopted


def _replicas_asked_for(args: argparse.Namespace) -> int | None:
    """The processes --num_gpus or --gpus ask for on this machine; None when neither is given."""
    if args.processes_per_machine is not None:
        return args.processes_per_machine
    if args.gpus:
        return len(args.gpus) // (2 if args.model_parallel else 1)
    return None


def _check_one_form(launched: Launched, asked: int | None) -> None:
    """One rank per GPU, or one per machine with --num_gpus; never both, and never a rank that
    quietly trains a machine's batch on one GPU."""
    local, launcher = launched.local_world_size, launched.launcher
    if asked is None or asked == local:
        return
    if launcher.one_rank_per_machine is None:
        raise UserError(
            f"{launcher.name} started {local} processes on this machine but --num_gpus/--gpus "
            f"ask for {asked}: {launcher.name} starts one process per GPU itself; give it "
            f"{launcher.processes_option} {asked} and leave --num_gpus/--gpus out"
        )
    if local > 1:
        raise UserError(
            f"{launcher.name} started {local} processes on this machine but --num_gpus/--gpus "
            f"ask for {asked}: use one form, one rank per GPU (leave --num_gpus/--gpus out) or "
            f"one rank per machine ({launcher.one_rank_per_machine}, --num_gpus {asked})"
        )


def _check_a_way_to_meet(args: argparse.Namespace, launched: Launched) -> None:
    """Machines meet at MASTER_ADDR:MASTER_PORT, through Redis, or in a directory they share; the
    default directory is each machine's own, where the others would never be found."""
    unshared = build_parser().get_default("file_store_path")
    if (
        launched.num_machines == 1
        or launched.master is not None
        or args.redis_host
        or args.file_store_path != unshared
    ):
        return
    raise UserError(
        f"{launched.name} started {launched.num_machines} machines but no way for them to meet: "
        "set MASTER_ADDR and MASTER_PORT (rank 0's machine and a free port there), or give "
        f"--redis_host, or --file_store_path on a directory every machine shares (not {unshared})"
    )


def run_id_of(args: argparse.Namespace, launched: Launched | None) -> str | None:
    """--run_id, or the launcher's job id under one. Required wherever machines meet through Redis
    or a shared directory."""
    if launched is None:
        run_id, needed_by = args.run_id, f"--num_shards {args.num_shards}"
        through_board, other_way = args.num_shards > 1, ""
    else:
        run_id, needed_by = args.run_id or launched.job_id, f"{launched.name} without MASTER_ADDR"
        # One rank meets nobody (launch/processes.py runs it as a run of one machine).
        through_board = launched.master is None and launched.world_size > 1
        other_way = ", or set MASTER_ADDR and MASTER_PORT (rank 0's machine and a free port there)"
    if through_board and run_id is None:
        raise UserError(
            f"{needed_by} needs --run_id: give every machine the same new id, "
            f"e.g. --run_id $(uuidgen){other_way}"
        )
    if run_id is not None and not RUN_ID_PATTERN.fullmatch(run_id):
        raise UserError(
            f"--run_id {run_id!r} may hold only letters, digits, '.', '_' and '-' "
            "(at most 128): it names Redis keys and files"
        )
    return run_id


def with_recipe_and_solver(
    args: argparse.Namespace, argv: Sequence[str] | None, launched: Launched | None
) -> tuple[argparse.Namespace, list[str]]:
    """The flags with --recipe's values beneath them, and --solver's beneath the command line's
    but above the recipe's (the file is the more specific); then the recipe's warm-up and EMA
    fitted to the run's epochs, batch and DB; the lines saying what each set."""
    if not RECIPES[args.recipe].values and not args.solver:
        return args, []  # nothing beneath the command line: no second parse of it
    given = given_flags(argv)
    args, lines = with_recipe(args, given)
    if args.solver:
        args, solver_lines = with_solver(args, given, launched)
        lines += solver_lines
    machines = launched.num_machines if launched is not None else args.num_shards
    args, fitted_lines = with_fitted(
        args, given, args.batch_size * machines, lambda: _images_per_epoch(args)
    )
    return args, lines + fitted_lines


def _images_per_epoch(args: argparse.Namespace) -> int:
    """--epoch_size, or the training DB's records (counted: one pass over the DB an epoch)."""
    if args.epoch_size is not None:
        return args.epoch_size
    if args.train_data == SYNTHETIC_DATA:
        return SYNTHETIC_EPOCH_SIZE
    from resnet50_trainer.data.formats.databases import open_database  # lmdb, plyvel: only here

    with open_database(args.train_data, args.db_type) as database:
        return len(database)


def _default_workers(processes_per_machine: int) -> int:
    return max(1, min(8, cores_per_process(processes_per_machine) - 1))
