"""The limits a container or a job sets, met for real: a small or full /dev/shm (a tmpfs bound over
it in a mount namespace of the run's own, as a container has one), a memory cgroup that the
kernel's OOM killer enforces, a pids cgroup, and rlimits set in the child (open files, threads,
address space). Each ends in one line naming the limit and its fix: before the start where the
run's needs can be reckoned (launch/needs.py, exit 2), where it happens otherwise (limits.py).
Skipped with the reason where this machine cannot make the limit (not root, no cgroup)."""

from __future__ import annotations

import contextlib
import os
import re
import resource
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.dbfactory import (
    datum_record,
    encode_image,
    make_jpeg,
    random_pixels,
    write_db,
    write_image_db,
)
from tests.support.trainer_runs import (
    HOOKS,
    REPOSITORY,
    RUN_TIMEOUT_S,
    fill_up,
    model_state,
    one_error_line,
    run_python,
    trainer_command,
    trainer_env,
    wait_for,
)

CGROUPS = Path("/sys/fs/cgroup")
as_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a mount namespace and cgroups of a test's own need root and unshare(1)",
)
pytestmark = as_root


@pytest.fixture(scope="module")
def small_db(module_tmp_path):
    return write_image_db(str(module_tmp_path / "db"), 32, 4)  # 4 steps an epoch


def on_dev_shm(directory) -> list[str]:
    """The command line prefix that runs a command with `directory` as its /dev/shm: a mount
    namespace of its own, as a container's, where a tmpfs the test made is bound over it."""
    bind = 'mount --bind "$0" /dev/shm && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", bind, str(directory)]


def run(command: list[str], preexec_fn=None, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        command,
        env=trainer_env(**env),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        preexec_fn=preexec_fn,
    )


def refused(done: subprocess.CompletedProcess, said: str) -> None:
    """The command ended before it started anything, exit 2, in one line matching `said`."""
    assert done.returncode == 2, done.stderr
    assert re.fullmatch(said, one_error_line(done.stderr)), done.stderr


def with_rlimit(limit: int, value: int):
    def set_limit() -> None:
        resource.setrlimit(limit, (value, value))

    return set_limit


@contextlib.contextmanager
def cgroup(controller: str, **settings: str) -> Iterator[Path]:
    """A cgroup of this test's own under `controller` (v1, or v2 where the controller is there),
    with `settings` written to its files; removed once its processes have gone."""
    if (CGROUPS / controller / "cgroup.procs").exists():
        group = CGROUPS / controller / f"resnet50_test_{os.getpid()}"
    elif controller in (CGROUPS / "cgroup.subtree_control").read_text().split():
        group = CGROUPS / f"resnet50_test_{os.getpid()}"
    else:
        pytest.skip(f"no cgroup {controller} controller here")
    group.mkdir()
    try:
        for name, value in settings.items():
            (group / name).write_text(value)
        yield group
    finally:
        wait_for(lambda: not (group / "cgroup.procs").read_text().strip(), 30, "its processes")
        group.rmdir()


def joining(group: Path):
    def join() -> None:
        (group / "cgroup.procs").write_text(str(os.getpid()))

    return join


# Shared memory (/dev/shm): rows 1, 2 and 22 of issue 44.


def test_a_small_dev_shm_refuses_the_run_before_it_starts(small_db, tmpfs, tmp_path):
    shm = tmpfs("shm", "64k")
    flags = ("--train_data", small_db, "--num_workers", "2", "--log_dir", str(tmp_path / "out"))
    done = run([*on_dev_shm(shm), *trainer_command(*flags)])
    refused(
        done,
        (
            r"resnet50-trainer: error: shared memory is short: /dev/shm, where input processes "
            r"hand their batches over, holds 64 KiB, 64 KiB of it free, and this run needs about "
            r"[\d.]+ KiB there: give it more room \(docker run --shm-size 2g; on Kubernetes an "
            r"emptyDir of medium Memory mounted on /dev/shm\) or use fewer --num_workers \(0 uses "
            r"none\)"
        ),
    )
    assert os.listdir(shm) == []


@pytest.mark.parametrize("command", ["resnet50-trainer", "resnet50-db bench"])
def test_a_read_only_dev_shm_is_named(command, small_db, tmpfs, tmp_path):
    """Refused before the start by the trainer; named where the semaphore is refused by the
    tools (red-team: "an input (DataLoader) process was lost as it handed a batch over (OSError:
    Read-only file system)")."""
    shm = tmpfs("shm", "4m")
    subprocess.run(["mount", "-o", "remount,ro", shm], check=True)
    trainer = command == "resnet50-trainer"
    flags = ("--train_data", small_db, "--num_workers", "2", "--log_dir", str(tmp_path / "out"))
    bench = ["resnet50_trainer.tools.db", "bench", small_db, "--batches", "1", "--image_size", "32"]
    started = trainer_command(*flags) if trainer else [sys.executable, "-m", *bench]
    done = run([*on_dev_shm(shm), *started])
    assert done.returncode == (2 if trainer else 1), done.stderr
    assert one_error_line(done.stderr) == (
        f"{command}: error: shared memory cannot be made: /dev/shm, where input processes hand "
        "their batches over, is mounted read-only: mount a tmpfs there that this user can write "
        "(docker run --shm-size 2g; on Kubernetes an emptyDir of medium Memory) or use "
        "--num_workers 0"
    )


# A pass that holds every batch it gets: once /dev/shm is full, nothing is freed there, and the
# next batch an input process makes cannot be (in a steady run the freed batches make room).
SHM_FILLED_MID_PASS = """
import os, sys, torch
from resnet50_trainer.data.formats.databases import read_keys
from resnet50_trainer.data.input_pipeline import device_batches
from resnet50_trainer.lifecycle import end_input_processes
from resnet50_trainer.limits import shortage_in
from resnet50_trainer.train.inputs import input_settings
from tests.support.trainer_runs import SMALL_RUN, config_of, fill_up
db = sys.argv[1]
settings = input_settings(config_of(*SMALL_RUN, "--train_data", db, "--num_workers", "2"), False)
order = [[(step * 8 + i) % 32 for i in range(8)] for step in range(100)]
keys = read_keys(db, "lmdb")
batches = iter(device_batches(db, "lmdb", keys, order, torch.device("cpu"), settings, False))
held = [next(batches)]
fill_up("/dev/shm")
try:
    while True:
        held.append(next(batches))
except Exception as error:
    print(shortage_in(error))
end_input_processes()
print(sorted(set(os.listdir("/dev/shm")) - {"filler"}))
"""


def test_dev_shm_filled_mid_pass_is_named_and_nothing_is_left_there(small_db, tmpfs):
    shm = tmpfs("shm", "4m")
    done = run([*on_dev_shm(shm), sys.executable, "-c", SHM_FILLED_MID_PASS, small_db])
    said, left = done.stdout.splitlines()
    assert re.fullmatch(
        r"shared memory ran out: /dev/shm, where input processes hand their batches over, holds 4 "
        r"MiB \([\d.]+ [KM]?i?B free\): give it more room .+",
        said,
    ), done.stdout + done.stderr
    assert left == "[]"  # what a failed allocation leaves there, removed


def test_the_open_file_limit_lowered_mid_run_ends_it_in_one_line(small_db, tmp_path):
    """Lowered below the files the run has open (prlimit(2), as a job's limit is changed), every
    file it opens from then on is refused: the next batch's shared memory first."""
    flags = ("--train_data", small_db, "--num_workers", "2", "--num_epochs", "1000")
    command = trainer_command(*flags, "--log_dir", str(tmp_path))
    started = subprocess.Popen(command, env=trainer_env(), text=True, stderr=subprocess.PIPE)
    first = tmp_path / "resnet50_model_1.pt"
    try:
        wait_for(first.exists, 180, "the first checkpoint")
        hard = resource.prlimit(started.pid, resource.RLIMIT_NOFILE)[1]
        resource.prlimit(started.pid, resource.RLIMIT_NOFILE, (8, hard))
        _, stderr = started.communicate(timeout=120)
    finally:
        if started.poll() is None:
            started.kill()
            started.communicate()
    assert started.returncode == 1, stderr
    assert one_error_line(stderr).startswith(
        "resnet50-trainer: error: rank 0 stopped: the limit on open files (ulimit -n) of 8 was "
        "reached: raise it (ulimit -n 4096; docker run --ulimit nofile=4096); the run cannot go on"
    ), stderr
    assert "Exception ignored" not in stderr
    assert model_state(first)


@pytest.mark.parametrize("subcommand", ["create", "bench"])
def test_resnet50_db_names_a_full_dev_shm(subcommand, tmpfs, tmp_path, small_db):
    shm = tmpfs("shm", "64k")
    fill_up(shm)
    images = tmp_path / "images" / "a"
    images.mkdir(parents=True)
    for number in range(4):
        (images / f"{number}.jpg").write_bytes(make_jpeg(40, 48, seed=number))
    arguments = {
        "create": [str(images.parent), str(tmp_path / "new_db")],
        "bench": [small_db, "--batches", "1", "--batch_size", "4", "--image_size", "32"],
    }[subcommand]
    tool = [sys.executable, "-m", "resnet50_trainer.tools.db", subcommand, *arguments]
    done = run([*on_dev_shm(shm), *tool, "--num_workers", "2"])
    assert done.returncode == 1, done.stderr
    assert one_error_line(done.stderr).startswith(
        f"resnet50-db {subcommand}: error: shared memory ran out: /dev/shm, where input processes "
        "hand their batches over, holds 64 KiB (0 B free): give it more room"
    )
    assert not (tmp_path / "new_db").exists()


# Open files: row 2.


def test_an_open_file_limit_below_the_run_s_need_refuses_it(small_db, tmp_path):
    flags = ("--train_data", small_db, "--num_workers", "2", "--log_dir", str(tmp_path))
    done = run(trainer_command(*flags), with_rlimit(resource.RLIMIT_NOFILE, 32))
    refused(
        done,
        (
            r"resnet50-trainer: error: the limit on open files \(ulimit -n\) of 32 is below the "
            r"about \d+ a training process opens: raise it \(ulimit -n 4096; docker run --ulimit "
            r"nofile=4096\)"
        ),
    )


# File size (ulimit -f; red-team).


def test_a_file_size_limit_below_a_checkpoint_refuses_the_run(small_db, tmp_path):
    flags = ("--train_data", small_db, "--log_dir", str(tmp_path))
    done = run(trainer_command(*flags), with_rlimit(resource.RLIMIT_FSIZE, 60 << 20))
    refused(
        done,
        (
            r"resnet50-trainer: error: the limit on file size \(ulimit -f\) of 60 MiB is below the "
            r"about [\d.]+ MiB a checkpoint of this run takes: raise it or remove it \(ulimit -f "
            r"unlimited\)"
        ),
    )
    assert os.listdir(tmp_path) == []


def test_resnet50_db_create_names_a_file_size_limit_the_db_outgrows(tmp_path):
    images = tmp_path / "images" / "a"
    images.mkdir(parents=True)
    for number in range(4):  # 50 KB or so each
        noise = encode_image(random_pixels(128, 128, seed=number))
        (images / f"{number}.jpg").write_bytes(noise)
    create = [sys.executable, "-m", "resnet50_trainer.tools.db", "create", str(images.parent)]
    target = tmp_path / "db"
    limit = with_rlimit(resource.RLIMIT_FSIZE, 16 << 10)
    done = run([*create, str(target), "--db_type", "leveldb"], limit)
    assert done.returncode == 1, done.stderr
    assert one_error_line(done.stderr) == (
        "resnet50-db create: error: the limit on file size (ulimit -f) of 16 KiB was reached: "
        "raise it or remove it (ulimit -f unlimited)"
    )
    assert not target.exists()


# Threads and processes: row 5.


def test_a_pids_cgroup_too_small_for_the_run_refuses_it(small_db, tmp_path):
    with cgroup("pids", **{"pids.max": "12"}) as group:
        flags = ("--train_data", small_db, "--num_workers", "2", "--log_dir", str(tmp_path))
        done = run(trainer_command(*flags), joining(group))
    refused(
        done,
        (
            r"resnet50-trainer: error: the limit on threads and processes \(12 of pids.max, its "
            r"cgroup's, \d+ in use\) is below the about \d+ more this run starts: raise it .+"
        ),
    )


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv(1)")
def test_a_user_s_process_limit_too_small_for_the_run_refuses_it(small_db, tmp_path):
    """ulimit -u binds users other than root: the run as nobody, allowed to read this checkout
    and its Python (CAP_DAC_READ_SEARCH), not to pass the limit (no CAP_SYS_RESOURCE)."""
    tmp_path.chmod(0o777)
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    as_nobody += ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]
    flags = ("--train_data", small_db, "--num_workers", "2", "--log_dir", str(tmp_path))
    done = run([*as_nobody, *trainer_command(*flags)], with_rlimit(resource.RLIMIT_NPROC, 12))
    refused(
        done,
        (
            r"resnet50-trainer: error: the limit on threads and processes \(12 of ulimit -u, this "
            r"user's, \d+ in use\) is below the about \d+ more this run starts: raise it .+"
        ),
    )


PAST_THE_LIMIT_ON_TASKS = """
import multiprocessing, sys, threading
from resnet50_trainer.limits import shortage_in
open(sys.argv[1] + "/cgroup.procs", "w").write("0")
open(sys.argv[1] + "/pids.max", "w").write("1")
server = multiprocessing.get_context("forkserver")  # as the launcher of several starts its own
for start in (threading.Thread(target=print).start, server.Process(target=print).start):
    try:
        start()
    except (RuntimeError, OSError) as error:
        print(shortage_in(error))
"""


def test_a_thread_or_a_process_that_cannot_start_is_named_as_a_limit():
    with cgroup("pids") as group:
        done = run_python(PAST_THE_LIMIT_ON_TASKS, str(group))
    said = (
        "the limit on threads and processes (1 of pids.max, its cgroup's, 1 in use) was reached: "
        "raise it (ulimit -u; docker run --pids-limit; Kubernetes' podPidsLimit)"
    )
    assert done.stdout.splitlines() == [said, said], done.stderr


# What a process maps: its address space (ulimit -v) and its private writable part (ulimit -d).
# Row 4.

MAPPED_BY_TORCH = """
import re, torch
status = open("/proc/self/status").read()
for field in ("VmSize", "VmData"):
    print(re.search(rf"^{field}:\\s*(\\d+) kB", status, re.M).group(1))
"""
MAPPINGS = {"ulimit -v": resource.RLIMIT_AS, "ulimit -d": resource.RLIMIT_DATA}


@pytest.fixture(scope="module")
def torch_mapped() -> dict[str, int]:
    """The bytes a process has mapped, of each kind a limit holds, once torch is imported."""
    sizes = run_python(MAPPED_BY_TORCH).stdout.split()
    return {flag: int(size) << 10 for flag, size in zip(MAPPINGS, sizes)}


@pytest.mark.parametrize("past_torch", [-256 << 20, 256 << 20])
@pytest.mark.parametrize("flag", list(MAPPINGS))
def test_a_limit_on_what_a_process_maps_below_the_run_s_need_refuses_it(
    small_db, tmp_path, torch_mapped, flag, past_torch
):
    limit = torch_mapped[flag] + past_torch
    flags = ("--train_data", small_db, "--num_workers", "2", "--log_dir", str(tmp_path))
    done = run(trainer_command(*flags), with_rlimit(MAPPINGS[flag], limit))
    assert done.returncode == 2, done.stderr
    line = one_error_line(done.stderr)
    named = rf"the (address-space|data-size) limit \({flag}\) of [\d.]+ [MG]iB"
    fix = rf"raise it or remove it \({flag} unlimited\)"
    if past_torch < 0:
        said = rf"torch cannot be loaded within {named}: {fix}"
    else:
        said = rf"{named} is below the about [\d.]+ GiB a training process maps: {fix}"
    assert re.fullmatch(f"resnet50-trainer: error: {said}", line), line


TORCH_TOOLS = ["resnet50_trainer.tools.db bench", "resnet50_trainer.tools.export"]


@pytest.mark.parametrize("tool", TORCH_TOOLS)
def test_the_tools_that_load_torch_name_a_limit_it_cannot_load_within(tool, torch_mapped, small_db):
    arguments = [small_db, "--batches", "1"] if tool.endswith("bench") else ["x.pt", "-o", "x.onnx"]
    limit = torch_mapped["ulimit -v"] - (256 << 20)
    command = [sys.executable, "-m", *tool.split(), *arguments]
    done = run(command, with_rlimit(resource.RLIMIT_AS, limit))
    refused(
        done,
        (
            r"resnet50-(db bench|export): error: torch cannot be loaded within the address-space "
            r"limit \(ulimit -v\) of [\d.]+ GiB: raise it or remove it \(ulimit -v unlimited\)"
        ),
    )


LMDB_PAST_THE_LIMIT = """
import resource, sys
from resnet50_trainer.data.formats.databases import open_database
from resnet50_trainer.errors import UserError
mapped = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (mapped + (16 << 20), resource.RLIM_INFINITY))
try:
    open_database(sys.argv[1], "lmdb")
except UserError as error:
    print(error)
"""


def test_an_lmdb_that_cannot_be_mapped_names_the_limit_not_the_db(tmp_path):
    pixels = [datum_record(0, pixels=random_pixels(200, 200, seed=seed)) for seed in range(300)]
    big = write_db(str(tmp_path / "big"), "lmdb", [(b"%08d" % i, p) for i, p in enumerate(pixels)])
    done = run_python(LMDB_PAST_THE_LIMIT, big)  # 36 MB to map, 16 MiB of room
    assert re.fullmatch(
        rf"cannot open LMDB {big}: the address-space limit \(ulimit -v\) of [\d.]+ [MG]iB was "
        r"reached: raise it or remove it \(ulimit -v unlimited\)",
        done.stdout.strip(),
    ), done.stdout + done.stderr


# Memory and crashes: rows 3 and 4. The fault at a known step (tests/support/hooks/sitecustomize.py)
# after the first epoch's checkpoint; the limit, the OOM killer and the crash are the kernel's.

FIRST_EPOCH_STEPS = 4


def faulty_run(small_db, out, fault: str, *flags: str, preexec_fn=None):
    command = trainer_command("--train_data", small_db, "--num_epochs", "2", "--log_dir", str(out))
    return run(
        [*command, *flags],
        preexec_fn,
        PYTHONPATH=os.pathsep.join([REPOSITORY, HOOKS]),
        RESNET50_TRAINER_TEST_FAULT_AFTER_STEPS=f"{FIRST_EPOCH_STEPS + 1}:{fault}:0",
    )


def oom_line(who: str, limit: str, out) -> str:
    """The pattern of the line that names an OOM kill of `who` (a pattern) under `limit`."""
    said = re.escape(
        f"was killed (SIGKILL) by the kernel's OOM killer, memory having run out (the memory "
        f"limit of its cgroup, {limit}): lower --batch_size or --num_workers, or give the run "
        "more memory (docker run --memory, Slurm's --mem, Kubernetes' resources.limits.memory); "
        f"the run stopped: resume it with --load_model_path {out}"
    )
    return f"resnet50-trainer: error: {who} {said}"


def memory_cgroup(limit: int) -> contextlib.AbstractContextManager[Path]:
    """A memory cgroup of this test's own whose processes may have `limit` bytes, swap none."""
    if (CGROUPS / "memory" / "cgroup.procs").exists():
        return cgroup("memory", **{"memory.limit_in_bytes": str(limit)})
    return cgroup("memory", **{"memory.max": str(limit), "memory.swap.max": "0"})


@pytest.mark.parametrize("processes", [1, 2])
def test_a_training_process_the_oom_killer_ends_is_named_and_its_checkpoint_kept(
    small_db, tmp_path, processes
):
    limit = 1536 << 20 if processes == 1 else 3 << 30
    with memory_cgroup(limit) as group:
        done = faulty_run(
            small_db, tmp_path, "grow", "--num_gpus", str(processes), preexec_fn=joining(group)
        )
    lines = [line for line in done.stderr.splitlines() if "error:" in line]
    assert "Traceback" not in done.stderr, done.stderr
    if processes == 1:  # the one process killed; its watcher speaks
        assert done.returncode == -9, done.stderr
        (line,) = lines
        assert re.fullmatch(
            oom_line(r"the training process \(pid \d+\)", "1.5 GiB", tmp_path), line
        )
    else:  # its launcher speaks; the other process may name the peer it lost too
        assert done.returncode == 1, done.stderr
        who = r"training process of rank 0 \(pid \d+\)"
        assert re.fullmatch(oom_line(who, "3 GiB", tmp_path), lines[-1]), done.stderr
    assert model_state(tmp_path / "resnet50_model_1.pt")


def test_a_crash_in_native_code_of_a_run_of_one_process_is_named_with_the_limit(small_db, tmp_path):
    limit = 64 << 30
    done = faulty_run(
        small_db, tmp_path, "crash", preexec_fn=with_rlimit(resource.RLIMIT_AS, limit)
    )
    assert done.returncode == -11, done.stderr
    assert re.fullmatch(
        r"resnet50-trainer: error: the training process \(pid \d+\) crashed in native code "
        r"\(SIGSEGV\); the address-space limit \(ulimit -v\) of 64 GiB may be why: raise it or "
        rf"remove it \(ulimit -v unlimited\); the run stopped: resume it with --load_model_path "
        rf"{tmp_path}",
        one_error_line(done.stderr),
    )
    assert "Fatal Python error" not in done.stderr


def test_a_launcher_the_oom_killer_ends_as_it_starts_its_processes_is_named(small_db, tmp_path):
    """500 MiB: torch loads in the launcher, but the fork server and 2 training processes do not
    fit, and the kernel ends whichever is largest as they start: the launcher (which ended with
    137 and no line, 3 of 3), the fork server or a training process."""
    flags = ("--train_data", small_db, "--num_gpus", "2", "--log_dir", str(tmp_path))
    with memory_cgroup(500 << 20) as group:
        done = run(trainer_command(*flags), joining(group))
    assert done.returncode in (1, -9), done.stderr
    assert (
        "by the kernel's OOM killer, memory having run out (the memory limit of its cgroup, "
        "500 MiB): lower --batch_size or --num_workers"
    ) in one_error_line(done.stderr)
