"""A Slurm cluster of this one machine for the tests: munged, slurmctld and slurmd from Debian's
packages (scripts/setup.sh installs them), configured in a temporary directory (key, sockets,
state, spool, logs, free ports), as root, without cgroups; and the client commands pointed at it
(SLURM_CONF). Stopped with everything it started, whatever the tests did."""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.support.redis_server import free_port

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "sinfo", "squeue", "scontrol", "scancel")
START_LIMIT_S = 30
# examples/slurm/train.sbatch's MASTER_PORT is 20000 + the job id: ids from one whose ports are
# free here, so that no other test's server stands on a job's port.
PORTS_FROM = 20000


def unavailable() -> str | None:
    """Why a cluster cannot start here, or None."""
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    if missing:
        return f"{', '.join(missing)} not installed (scripts/setup.sh installs Slurm and munge)"
    if os.geteuid() != 0:
        return "a Slurm of this machine runs its daemons as root, and this is not root"
    return None


class SlurmCluster:
    """`with SlurmCluster(directory) as cluster:` one node of this machine's CPUs, one partition.
    `cluster.run(command...)` runs a client command against it."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.conf = directory / "slurm.conf"
        self.socket = directory / "munge" / "socket"
        self.environment = {**os.environ, "SLURM_CONF": str(self.conf)}

    def __enter__(self) -> SlurmCluster:
        try:
            self._start_munge()
            self._write_conf()
            for daemon in ("slurmctld", "slurmd"):
                subprocess.run([daemon, "-f", str(self.conf)], check=True, capture_output=True)
            self._wait_for_the_node()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        for job in self.run("squeue", "-h", "-o", "%i", check=False).stdout.split():
            self.run("scancel", job, check=False)
        for daemon in ("slurmd", "slurmctld"):
            _stop(self.directory / f"{daemon}.pid")
        subprocess.run(["munged", "--stop", f"--socket={self.socket}"], capture_output=True)

    def run(self, *command: str, check: bool = True, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            command,
            env={**self.environment, **env},
            capture_output=True,
            text=True,
            check=check,
            timeout=60,
        )

    def log(self) -> str:
        """The daemons' last words, for a failed test's message."""
        tails = []
        for name in ("slurmctld.log", "slurmd.log", "munged.log"):
            path = self.directory / "log" / name
            if path.exists():
                tails.append(f"--- {name}\n" + "\n".join(path.read_text().splitlines()[-15:]))
        return "\n".join(tails)

    def _start_munge(self) -> None:
        munge = self.directory / "munge"
        for folder in (munge, self.directory / "log", self.directory / "state"):
            folder.mkdir(parents=True, exist_ok=True)
        munge.chmod(0o700)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        subprocess.run(
            [
                "munged",
                "--force",  # a socket directory only root can enter: fine for root's daemons
                f"--socket={self.socket}",
                f"--key-file={key}",
                f"--log-file={self.directory / 'log' / 'munged.log'}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--seed-file={munge / 'seed'}",
            ],
            check=True,
            capture_output=True,
        )

    def _write_conf(self) -> None:
        host, directory = socket.gethostname().split(".")[0], self.directory
        first_job = _first_job_id_with_free_ports()
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=tests",
                    f"SlurmctldHost={host}",
                    f"SlurmctldPort={free_port()}",
                    f"SlurmdPort={free_port()}",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={self.socket}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    f"StateSaveLocation={directory / 'state'}",
                    f"SlurmdSpoolDir={directory / 'spool'}",
                    f"SlurmctldPidFile={directory / 'slurmctld.pid'}",
                    f"SlurmdPidFile={directory / 'slurmd.pid'}",
                    f"SlurmctldLogFile={directory / 'log' / 'slurmctld.log'}",
                    f"SlurmdLogFile={directory / 'log' / 'slurmd.log'}",
                    # No cgroups in a container: processes tracked by their parents, no binding.
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "MpiDefault=none",
                    "SchedulerType=sched/builtin",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_CPU",
                    "ReturnToService=2",
                    f"FirstJobId={first_job}",
                    # Slurm's own default: what a stop signal's save must fit in.
                    "KillWait=30",
                    f"NodeName={host} CPUs={os.cpu_count() or 1} RealMemory=1000 State=UNKNOWN",
                    # Tests oversubscribe a 2-core machine: 2 tasks of 1 CPU each, several jobs.
                    f"PartitionName=tests Nodes={host} Default=YES MaxTime=INFINITE State=UP "
                    "OverSubscribe=FORCE:4",
                    "",
                ]
            )
        )

    def _wait_for_the_node(self) -> None:
        deadline = time.monotonic() + START_LIMIT_S
        while time.monotonic() < deadline:
            state = self.run("sinfo", "-h", "-o", "%T", check=False).stdout.strip()
            if state in ("idle", "mixed", "allocated"):
                return
            time.sleep(0.5)
        raise RuntimeError(f"the Slurm node did not come up in {START_LIMIT_S} s:\n{self.log()}")


def _first_job_id_with_free_ports() -> int:
    """A first job id whose next 20 jobs' MASTER_PORTs are free here now."""
    for first in random.Random().sample(range(1, 19_000), 100):
        if all(_port_free(PORTS_FROM + first + offset) for offset in range(20)):
            return first
    raise RuntimeError("no 20 free ports from 20000 to 39999")


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _stop(pid_file: Path) -> None:
    """The daemon of `pid_file` ended: SIGTERM, then SIGKILL after 10 s."""
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        return
    for signal_number, wait_s in ((15, 10.0), (9, 5.0)):
        try:
            os.kill(pid, signal_number)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
