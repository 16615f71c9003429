"""The launch recipes in examples/, read as Slurm and Kubernetes read them and run on CPU as they
would run there: the sbatch script itself under bash, with stand-ins for srun (2 tasks on this
machine, each with srun's variables) and scontrol; the Kubernetes Job's torchrun command as its 2
pods would run it (2 torchrun agents meeting through c10d on this machine). Small-run flags are
added after the recipe's own, which they override; only the paths and GPU counts are swapped."""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.redis_server import free_port
from tests.support.trainer_runs import REPOSITORY, RUN_TIMEOUT_S, SMALL_RUN, trainer_env

EXAMPLES = os.path.join(REPOSITORY, "examples")
SBATCH = os.path.join(EXAMPLES, "slurm", "train.sbatch")
KUBERNETES_JOB = os.path.join(EXAMPLES, "kubernetes", "resnet50-job.yaml")
NAME = "resnet50_model"
# srun as far as the recipe uses it: its options, then SLURM_NTASKS tasks of the command on this
# machine, each with the variables srun sets for a task; the step's status is the worst task's.
FAKE_SRUN = """#!{python}
import os, subprocess, sys
command = sys.argv[1:]
while command[0].startswith("-"):
    command.pop(0)
tasks = int(os.environ["SLURM_NTASKS"])
placed = lambda task: {{"SLURM_PROCID": str(task), "SLURM_LOCALID": str(task),
                       "SLURM_STEP_TASKS_PER_NODE": str(tasks)}}
running = [subprocess.Popen(command, env={{**os.environ, **placed(task)}}) for task in range(tasks)]
sys.exit(max(task.wait() for task in running))
"""


@pytest.fixture(scope="module")
def databases(module_tmp_path):
    """(training DB, test DB), small."""
    from tests.support.dbfactory import write_image_db

    root = module_tmp_path
    return tuple(write_image_db(str(root / name), 32, 4) for name in ("train", "test"))


def sbatch_options(path: str) -> dict[str, str]:
    """The script's #SBATCH options, as sbatch reads them: the comment lines before the first
    command."""
    options = {}
    for line in Path(path).read_text().splitlines():
        if line.startswith("#SBATCH "):
            name, _, value = line[len("#SBATCH ") :].strip().partition("=")
            options[name] = value
        elif line.strip() and not line.startswith("#"):
            break
    return options


def executable(path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def stand_ins(directory) -> str:
    """A PATH directory with srun, scontrol (show hostnames of a one-host list) and the
    resnet50-trainer command of this repository."""
    directory.mkdir(exist_ok=True)
    executable(directory / "srun", FAKE_SRUN.format(python=sys.executable))
    executable(directory / "scontrol", '#!/bin/sh\necho "$3"\n')
    executable(
        directory / "resnet50-trainer",
        f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m resnet50_trainer "$@"\n',
    )
    return str(directory)


def test_the_slurm_script_asks_for_one_task_per_gpu_and_requeue():
    options = sbatch_options(SBATCH)
    assert "--requeue" in options
    assert options["--ntasks-per-node"] == options["--gpus-per-node"]
    assert re.search(r"srun [^\n]*resnet50-trainer", Path(SBATCH).read_text())
    assert "--auto_resume" in Path(SBATCH).read_text()


def job_id_with_a_free_port() -> str:
    """A Slurm job id whose MASTER_PORT (the script's 20000 + id % 20000) is free here now."""
    for job_id in random.Random().sample(range(1, 20000), 100):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", 20000 + job_id))
            except OSError:
                continue
        return str(job_id)
    raise AssertionError("no port from 20000 to 39999 is free")


def run_sbatch_script(tmp_path, databases, job_id: str, *flags: str) -> subprocess.CompletedProcess:
    """The script as sbatch runs job `job_id` of 1 node and 2 tasks (its variables set as sbatch
    sets them), `flags` after the script's name."""
    job = {
        "SLURM_JOB_ID": job_id,
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_NNODES": "1",
        "SLURM_NTASKS": "2",
        "SLURM_NTASKS_PER_NODE": "2",
        "PATH": os.pathsep.join([stand_ins(tmp_path / "bin"), os.environ["PATH"]]),
        "TRAIN_DATA": databases[0],
        "TEST_DATA": databases[1],
        "RUN_DIR": str(tmp_path / "run"),
    }
    return subprocess.run(
        ["bash", SBATCH, *SMALL_RUN, *flags],
        env=trainer_env(**job),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


# Runs of 1 and 2 epochs: without the recipes' 5-epoch warm-up, which must end before the run does.
SHORT = ("--warmup_epochs", "0")


def test_the_slurm_script_trains_and_a_requeued_job_continues(tmp_path, databases):
    job_id = job_id_with_a_free_port()  # a requeued job keeps its id
    first = run_sbatch_script(tmp_path, databases, job_id, "--num_epochs", "1", *SHORT)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "2 processes x 4 images = global batch 8" in first.stderr
    assert "Parameters identical on all 2 processes" in first.stderr
    requeued = run_sbatch_script(tmp_path, databases, job_id, "--num_epochs", "2", *SHORT)
    assert requeued.returncode == 0, requeued.stderr[-3000:]
    assert f"Resumed from {tmp_path / 'run' / NAME}_1.pt: epoch 1 done" in requeued.stderr
    assert os.path.exists(tmp_path / "run" / f"{NAME}_2.pt")


def test_the_slurm_script_does_not_retry_bad_input(tmp_path, databases):
    refused = run_sbatch_script(tmp_path, databases, "1", "--num_epochs", "0")
    assert refused.returncode == 2
    assert "attempt" not in refused.stderr


def kubernetes_objects(path: str) -> dict[str, dict]:
    """The file's objects by kind. It is YAML written as JSON: its comment lines aside, JSON."""
    lines = Path(path).read_text().splitlines(keepends=True)
    text = "".join(line for line in lines if not line.lstrip().startswith("#"))
    listed = json.loads(text)
    assert (listed["apiVersion"], listed["kind"]) == ("v1", "List")
    return {item["kind"]: item for item in listed["items"]}


def option(arguments: list[str], name: str) -> str:
    return arguments[arguments.index(name) + 1]


def test_the_kubernetes_job_has_a_pod_per_node_and_a_process_per_gpu():
    objects = kubernetes_objects(KUBERNETES_JOB)
    job, service = objects["Job"]["spec"], objects["Service"]
    pod = job["template"]["spec"]
    (container,) = pod["containers"]
    arguments = container["args"]
    assert job["completionMode"] == "Indexed"
    assert job["completions"] == job["parallelism"] == int(option(arguments, "--nnodes"))
    assert (
        int(option(arguments, "--nproc-per-node"))
        == container["resources"]["limits"]["nvidia.com/gpu"]
    )
    assert int(option(arguments, "--max-restarts")) >= 1 and pod["restartPolicy"] == "OnFailure"
    # The rendezvous is at pod 0, by the name the headless Service gives it.
    job_name, subdomain = objects["Job"]["metadata"]["name"], pod["subdomain"]
    assert service["metadata"]["name"] == subdomain and service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"job-name": job_name}
    host, port = option(arguments, "--rdzv-endpoint").split(":")
    assert host == f"{job_name}-0.{subdomain}"
    assert service["spec"]["ports"][0]["port"] == int(port)
    assert "--auto_resume" in arguments and container["command"] == ["torchrun"]


def test_the_kubernetes_jobs_command_trains_on_two_pods(tmp_path, databases):
    """Both pods' torchrun, on this machine: 1 process each instead of 8 GPUs, the rendezvous on
    a local port, the volumes' paths swapped for small ones."""
    objects = kubernetes_objects(KUBERNETES_JOB)
    (container,) = objects["Job"]["spec"]["template"]["spec"]["containers"]
    swapped = {
        "--nproc-per-node": "1",
        "--rdzv-endpoint": f"127.0.0.1:{free_port()}",
        "--train_data": databases[0],
        "--test_data": databases[1],
        "--log_dir": str(tmp_path / "run"),
    }
    arguments = list(container["args"])
    for name, value in swapped.items():
        arguments[arguments.index(name) + 1] = value
    # Kubernetes expands $(JOB_NAME) from the container's env: the Job's name label.
    arguments = [a.replace("$(JOB_NAME)", objects["Job"]["metadata"]["name"]) for a in arguments]
    command = [sys.executable, "-m", "torch.distributed.run", *arguments, *SMALL_RUN]
    command += ["--num_epochs", "1", *SHORT, "--first_iter_timeout", "120"]
    logs = [tmp_path / f"pod{index}.txt" for index in range(2)]
    pods = []
    for log in logs:
        with open(log, "w") as output_file:
            pods.append(
                subprocess.Popen(
                    command, env=trainer_env(), stdout=output_file, stderr=subprocess.STDOUT
                )
            )
    try:
        for pod, log in zip(pods, logs):
            pod.wait(timeout=RUN_TIMEOUT_S)
            assert pod.returncode == 0, log.read_text()[-3000:]
    finally:
        for pod in pods:
            if pod.poll() is None:
                pod.kill()
    outputs = [log.read_text() for log in logs]
    output = "".join(outputs)
    assert "2 processes x 8 images = global batch 16" in output
    assert "Parameters identical on all 2 processes" in output
    assert os.path.exists(tmp_path / "run" / f"{NAME}_1.pt")
