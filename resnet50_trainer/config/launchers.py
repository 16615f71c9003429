"""Rank and world from the launcher that started this process: torchrun, srun (SLURM), mpirun
(Open MPI) or mpiexec (MPICH, Intel MPI). Read once, from the environment; without any, our own
launcher starts the processes."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

from resnet50_trainer.errors import UserError


@dataclass(frozen=True)
class Launcher:
    """What the trainer knows of one launcher: one entry of _LAUNCHERS, read wherever a launcher
    acts differently, so that no code asks for one by its name. The defaults are an MPI-style
    launcher's: an entry states how it differs."""

    name: str
    # The variables it sets for rank, world size, local rank and local world size.
    variables: tuple[str, str, str, str]
    # Its command line for one rank per machine, the original's way, that starts --num_gpus
    # processes itself; None where it starts one process per GPU only, with `processes_option`.
    one_rank_per_machine: str | None
    # It always sets all four: a part of them is a hand-made environment that would otherwise
    # quietly train alone (srun's shell sets a part: an sbatch script outside a step).
    sets_all_four: bool = True
    processes_option: str | None = None
    # The variable counting the rounds of a job whose agent serves one store to all of them (see
    # _round_prefix); None where a job is one round.
    round_variable: str | None = None
    # It may give each rank its own GPU(s) through CUDA_VISIBLE_DEVICES (srun --gpus-per-task,
    # mpirun with a binding script); torchrun binds none.
    binds_gpus: bool = True


_LAUNCHERS = (
    Launcher(
        "torchrun",
        ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
        one_rank_per_machine=None,
        processes_option="--nproc-per-node",
        round_variable="TORCHELASTIC_RESTART_COUNT",
        binds_gpus=False,
    ),
    Launcher(
        "srun",
        # SLURM_STEP_TASKS_PER_NODE is set by srun for its step, not in an sbatch script's shell.
        ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE"),
        sets_all_four=False,
        one_rank_per_machine="srun --ntasks-per-node 1",
    ),
    Launcher(
        "mpirun",
        (
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        ),
        one_rank_per_machine="mpirun --map-by ppr:1:node",
    ),
    # MPICH's and Intel MPI's process manager (Hydra); after srun, whose PMI plugins set PMI_RANK.
    Launcher(
        "mpiexec",
        ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
        one_rank_per_machine="mpiexec -ppn 1",
    ),
)
_LAUNCHER_NAMED = {launcher.name: launcher for launcher in _LAUNCHERS}
# The launcher's id of this job, the same in every process of it: Open MPI up to 4, PMIx (Open MPI
# 5, srun --mpi=pmix), SLURM. The more particular first: one SLURM job may hold several runs.
_JOB_ID_VARIABLES = ("OMPI_MCA_orte_ess_jobid", "PMIX_NAMESPACE", "SLURM_JOB_ID")


@dataclass(frozen=True)
class Launched:
    name: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int  # processes on this machine; the same on every machine
    master: tuple[str, int] | None  # MASTER_ADDR:MASTER_PORT when set: the meeting point
    job_id: str | None  # the launcher's job id, as a run id: the run id when none is given
    # The prefix of this round's keys on the store at `master` (see _round_prefix).
    round_prefix: str = ""

    @property
    def launcher(self) -> Launcher:
        return _LAUNCHER_NAMED[self.name]

    @property
    def num_machines(self) -> int:
        return self.world_size // self.local_world_size

    @property
    def machine_index(self) -> int:
        return self.rank // self.local_world_size


def detect_launcher(environ: Mapping[str, str]) -> Launched | None:
    for launcher in _LAUNCHERS:
        name, variables = launcher.name, launcher.variables
        present = [variable for variable in variables if variable in environ]
        if launcher.sets_all_four and 0 < len(present) < len(variables):
            missing = [variable for variable in variables if variable not in environ]
            raise UserError(
                f"{', '.join(present)} set but not {', '.join(missing)}: {name} sets "
                "all four; start the run with the launcher, or unset them to train "
                "without one"
            )
        if len(present) == len(variables):
            rank, world, local_rank, local_world = (_number(environ, name, v) for v in variables)
            _check_placement(name, variables, rank, world, local_rank, local_world)
            return Launched(
                name,
                rank,
                world,
                local_rank,
                local_world,
                _master(environ),
                _job_id(environ),
                _round_prefix(environ, launcher),
            )
    return None


def _round_prefix(environ: Mapping[str, str], launcher: Launcher) -> str:
    """torchrun's agent serves one store at MASTER_ADDR:MASTER_PORT for every round of a job (its
    --max-restarts and membership changes): the keys an earlier round's process group left there
    (a killed rank's Gloo address, NCCL's id) would be read by the next round, whose ranks would
    then wait on dead peers. Each round takes keys of its own: a restart after a failure counts
    TORCHELASTIC_RESTART_COUNT up, one after a change of machines changes the world size."""
    if launcher.round_variable is None:
        return ""
    restart = environ.get(launcher.round_variable, "0").strip()
    world_size = environ[launcher.variables[1]].strip()
    return f"resnet50_trainer/restart_{restart}/world_{world_size}"


def _job_id(environ: Mapping[str, str]) -> str | None:
    """The launcher's job id made a plain name (a run id names Redis keys and files): PMIx's
    "prterun-host-4711@1" becomes "prterun-host-4711_1"."""
    for variable in _JOB_ID_VARIABLES:
        value = environ.get(variable, "").strip()
        if value:
            name = re.sub(r"[^A-Za-z0-9._-]", "_", value)
            return name if len(name) <= 128 else hashlib.sha256(value.encode()).hexdigest()
    return None


def _number(environ: Mapping[str, str], launcher: str, variable: str) -> int:
    # SLURM writes tasks per node as "2(x3)" (2 on each of 3 nodes) or "2,1" (uneven).
    text = environ[variable].strip()
    match = re.fullmatch(r"(\d+)(\(x\d+\))?", text)
    if match:
        return int(match.group(1))
    if re.fullmatch(r"\d+(\(x\d+\))?(,\d+(\(x\d+\))?)+", text):
        raise UserError(
            f"{variable}={environ[variable]!r} set by {launcher}: the machines run different "
            "numbers of processes; start the same number of processes on every machine"
        )
    raise UserError(
        f"{variable}={environ[variable]!r} set by {launcher} is not a whole number (0 or "
        f"more): check the launcher's command line or unset {variable}"
    )


def _check_placement(
    launcher: str,
    variables: tuple[str, ...],
    rank: int,
    world: int,
    local_rank: int,
    local_world: int,
) -> None:
    """Sizes of at least one process, the same number on every machine, and ranks inside them, or
    the launcher's environment is not one we can place a process by (a hand-set variable, say)."""
    rank_name, world_name, local_rank_name, local_world_name = variables
    for name, value in ((world_name, world), (local_world_name, local_world)):
        if value < 1:
            raise UserError(
                f"{name}={value} set by {launcher}: a run needs at least one process; "
                "check the launcher's command line or unset the variable"
            )
    if world % local_world:
        raise UserError(
            f"{launcher} started {local_world} processes on this machine and "
            f"{world} in all: start the same number on every machine"
        )
    for name, value, size, size_name in (
        (rank_name, rank, world, world_name),
        (local_rank_name, local_rank, local_world, local_world_name),
    ):
        if value >= size:
            raise UserError(
                f"{name}={value} set by {launcher} is not below {size_name}={size}: "
                "check the launcher's command line or unset the variable"
            )


def _master(environ: Mapping[str, str]) -> tuple[str, int] | None:
    if "MASTER_ADDR" not in environ or "MASTER_PORT" not in environ:
        return None
    if not environ["MASTER_ADDR"].strip():
        raise UserError(
            "MASTER_ADDR is empty: set it to the address of the machine of rank 0, "
            "or unset MASTER_ADDR and MASTER_PORT"
        )
    try:
        port = int(environ["MASTER_PORT"])
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise UserError(
            f"MASTER_PORT={environ['MASTER_PORT']!r} is not a port number (1 to "
            "65535): check the launcher's command line"
        )
    return environ["MASTER_ADDR"], port


def sees_only_its_own_gpus(
    processes_per_machine: int, per_replica: int, visible: int, environ: Mapping[str, str]
) -> bool:
    """srun --gpus-per-task, or mpirun with a binding script, give each of a machine's ranks its own
    GPU(s) through CUDA_VISIBLE_DEVICES: such a rank sees one replica's worth, numbered from 0,
    whatever its local rank. (One process alone on a machine claims GPUs by --gpus as before.)"""
    return (
        processes_per_machine > 1
        and visible == per_replica
        and bool(environ.get("CUDA_VISIBLE_DEVICES", "").strip())
    )


def gpus_the_machine_holds(
    launched: Launched | None, visible: int, model_parallel: bool, environ: Mapping[str, str]
) -> int:
    """The GPUs of this machine as the run counts them: a rank that sees only its own (above),
    started one per replica by srun or mpirun, stands for the machine's local_world_size replicas.
    Not under torchrun, which binds no GPU: a rank there that sees one GPU is a machine of one."""
    per_replica = 2 if model_parallel else 1
    if (
        launched is not None
        and launched.launcher.binds_gpus
        and sees_only_its_own_gpus(launched.local_world_size, per_replica, visible, environ)
    ):
        return launched.local_world_size * per_replica
    return visible
