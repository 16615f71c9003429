"""The trainer in tests: its Config from flags, small CPU runs as real commands, their processes
and outputs (run logs, checkpoints); and what a fresh interpreter imports for a command line."""

from __future__ import annotations

import ast
import csv
import glob
import os
import subprocess
import sys
import time
from collections.abc import Callable

import torch

from resnet50_trainer.cli import build_parser, config_from_args, with_recipe_and_solver
from resnet50_trainer.config.launchers import Launched, detect_launcher
from resnet50_trainer.config.settings import Config

SUPPORT = os.path.dirname(os.path.abspath(__file__))
REPOSITORY = os.path.dirname(os.path.dirname(SUPPORT))
HOOKS = os.path.join(SUPPORT, "hooks")  # sitecustomize.py: fault injection
RUN_TIMEOUT_S = 240
# ResNet-18 at 32 px on CPU, labels 0..3: the cheapest run that is still the real trainer.
SMALL_RUN = [
    "--use_cpu",
    "--num_layers",
    "18",
    "--image_size",
    "32",
    "--batch_size",
    "8",
    "--num_labels",
    "4",
    "--num_workers",
    "0",
    "--print_every",
    "1000",
]


def trainer_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "resnet50_trainer", *SMALL_RUN, *args]


def trainer_env(**extra: str) -> dict:
    return {**os.environ, "PYTHONPATH": REPOSITORY, **extra}


def pause_before_rename(seconds: float) -> dict:
    """The environment that holds a run's checkpoint writer `seconds` between its fsync and its
    rename (tests/support/hooks/sitecustomize.py), in every process of the run."""
    return {
        "PYTHONPATH": os.pathsep.join([REPOSITORY, HOOKS]),
        "RESNET50_TRAINER_TEST_PAUSE_BEFORE_RENAME": str(seconds),
    }


def signal_as_imported(module: str, signal_name: str) -> dict:
    """The environment in which each process of a run that imports `module` itself sends signal
    `signal_name` to its process group as that import begins (tests/support/hooks/sitecustomize.py):
    a Ctrl-C while a process imports, not at a time."""
    return {
        "PYTHONPATH": os.pathsep.join([REPOSITORY, HOOKS]),
        "RESNET50_TRAINER_TEST_SIGNAL_AS_IMPORTED": f"{module}:{signal_name}",
    }


def config_of(*flags: str, gpus_present: int = 0, launched: Launched | None = None) -> Config:
    """The Config the command line makes of exactly these flags (and `gpus_present` GPUs), in a
    process the `launched` launcher started; a --solver file applied under them."""
    args, _ = with_recipe_and_solver(build_parser().parse_args(list(flags)), flags, launched)
    return config_from_args(args, gpus_present, launched)


def run_trainer(
    *args: str, cwd: str | os.PathLike | None = None, **env: str
) -> subprocess.CompletedProcess:
    """A run on SMALL_RUN (a later flag overrides its value) to its end."""
    return subprocess.run(
        trainer_command(*args),
        cwd=cwd,
        env=trainer_env(**env),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


def start_trainer(*args: str, **env: str) -> subprocess.Popen:
    """The run leads its own process group, as a command started from a shell does."""
    return subprocess.Popen(
        trainer_command(*args),
        env=trainer_env(**env),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def start_long_run(database: str, out, *args: str, **env: str) -> subprocess.Popen:
    """A run of 1000 epochs, far longer than any test, logging and checkpointing into `out`;
    returns once its first checkpoint is in place."""
    run = start_trainer(
        "--train_data", database, "--num_epochs", "1000", "--log_dir", str(out), *args, **env
    )
    first = os.path.join(out, "resnet50_model_1.pt")
    try:
        wait_for(lambda: os.path.exists(first), 180, "the first checkpoint")
    except AssertionError:
        run.kill()
        raise AssertionError(run.communicate()[1]) from None
    return run


def training_processes(launcher_pid: int) -> list[int]:
    """The launcher's training processes, in rank order (they are started in that order): the
    children of its fork server (launch/processes.py's _start_fork_server), or its own spawned
    ones where it could start no server."""
    ours = children(launcher_pid)
    servers = [pid for pid in ours if b"forkserver" in command_line(pid)]
    started = [pid for server in servers for pid in children(server)]
    if not servers:
        started = [pid for pid in ours if b"spawn_main" in command_line(pid)]
    return sorted(started, key=lambda pid: (int(process_stat(pid)[19]), pid))


def children(pid: int) -> list[int]:
    """The processes `pid` started that are still there; none once it is gone."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as file:
            return [int(child) for child in file.read().split()]
    except FileNotFoundError:
        return []


def command_line(pid: int) -> bytes:
    """/proc/PID/cmdline; empty once the process is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            return file.read()
    except FileNotFoundError:
        return b""


def process_stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command's name (proc(5)'s fields 3 on: [0] is the
    state, R/S/T/Z..., [19] the start time); FileNotFoundError once the process is gone."""
    with open(f"/proc/{pid}/stat") as file:
        return file.read().rsplit(")", 1)[1].split()


def running(pid: int) -> bool:
    """Whether `pid` is a live process (not gone, not a zombie awaiting its reaper)."""
    try:
        return process_stat(pid)[0] != "Z"
    except FileNotFoundError:
        return False


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def files(directory) -> dict:
    """name -> (size, mtime_ns) of every file in `directory`: what a failed run must not touch."""
    return {
        entry.name: (entry.stat().st_size, entry.stat().st_mtime_ns)
        for entry in os.scandir(directory)
    }


def model_state(path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def read_log(directory) -> tuple[str, str, list[dict]]:
    """The one run log in `directory`: its path, its first line (the settings) and its rows."""
    (path,) = glob.glob(os.path.join(directory, "resnet50_*.log"))
    with open(path) as file:
        first_line = file.readline().rstrip("\n")
    return path, first_line, _rows(path)


def log_rows(directory) -> list[dict]:
    """The CSV run logs' rows in `directory`, in the order the logs were written."""
    names = sorted(name for name in os.listdir(directory) if name.endswith(".log"))
    return [row for name in names for row in _rows(os.path.join(directory, name))]


def _rows(log_path: str) -> list[dict]:
    with open(log_path) as file:
        return list(csv.DictReader(line for line in file if not line.startswith("#")))


def fill_up(directory, leave_bytes: int = 0) -> None:
    """Fill the file system of `directory` with one file until a write fails (ENOSPC), then give
    back `leave_bytes` (rounded by the file system to whole blocks)."""
    path = os.path.join(directory, "filler")
    with open(path, "wb", buffering=0) as file:
        try:
            while True:
                file.write(b"\0" * 4096)
        except OSError:
            pass
    os.truncate(path, max(0, os.path.getsize(path) - leave_bytes))


def one_error_line(stderr: str) -> str:
    """The one "error:" line a failed run printed, with no traceback beside it."""
    errors = [line for line in stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    return errors[0]


def run_python(source: str, *argv: str, **env: str) -> subprocess.CompletedProcess:
    """`python -c source argv...` in a fresh interpreter that imports this repository's package,
    with `env` added to the environment."""
    return subprocess.run(
        [sys.executable, "-c", source, *argv],
        capture_output=True,
        text=True,
        env=trainer_env(**env),
        timeout=60,
    )


def imported_by(module: str, argvs: list[list[str]], packages: tuple[str, ...]) -> list[str]:
    """The modules of `packages` a fresh interpreter holds after `module`.main(argv) for each argv
    in turn (the SystemExit of --help or a refusal is caught): what a command loads early."""
    probe = (
        "import sys\n"
        f"from {module} import main\n"
        f"for argv in {argvs!r}:\n"
        "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
        f"print(sorted(name for name in sys.modules if name.split('.')[0] in {packages!r}))\n"
    )
    done = run_python(probe)
    assert done.returncode == 0, done.stderr
    return ast.literal_eval(done.stdout.strip().splitlines()[-1])


def in_process(capsys, main: Callable[[list[str]], object], *args: str) -> tuple[object, str]:
    """A command's `main` run on `args` in this process (a refusal needs no fresh interpreter to
    import torch): its exit status (argparse exits; a check across flags returns it) and stderr."""
    try:
        status = main(list(args))
    except SystemExit as exit_info:
        status = exit_info.code
    return (0 if status is None else status), capsys.readouterr().err


def refused_in_process(capsys, *args: str) -> str:
    """Run the command line in this process on SMALL_RUN; it must stop before training: exit 2,
    one line (returned), no traceback."""
    from resnet50_trainer import cli

    status, error = in_process(capsys, cli.main, *SMALL_RUN, *args)
    assert status == 2, error
    lines = [line for line in error.splitlines() if line.startswith("resnet50-trainer: error:")]
    assert len(lines) == 1 and "Traceback" not in error, error
    return lines[0]


def refused_beside(capsys, earlier_run, *args: str) -> str:
    """Run the command line in-process with --log_dir `earlier_run` (a directory of an earlier
    run's files); assert exit 2, one line, nothing of the earlier run touched; the line."""
    before = files(earlier_run)
    line = refused_in_process(capsys, "--log_dir", str(earlier_run), *args)
    assert files(earlier_run) == before
    return line


def launched(environ: dict[str, str]) -> Launched:
    """What detect_launcher makes of `environ`, which names a launcher."""
    found = detect_launcher(environ)
    assert found is not None, environ
    return found
