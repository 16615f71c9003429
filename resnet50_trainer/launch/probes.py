"""The flags checked against this machine as soon as they are read: the paths they name, the
network interfaces, the GPU count. Torch-free (but for the GPU count), so that a refusal answers
at once; what needs torch, the checkpoints or a database's records is preflight.py's, at launch."""

from __future__ import annotations

import os
import subprocess
import sys

from resnet50_trainer.config.settings import Config
from resnet50_trainer.distributed.transport import check_transport
from resnet50_trainer.errors import UserError
from resnet50_trainer.machine import tightest_mapping_limit
from resnet50_trainer.path_words import check_reachable, shown


def check_machine(config: Config) -> None:
    """UserError on the first setting this machine cannot honour."""
    _check_databases_exist(config)
    check_transport(config.distributed_transport, config.distributed_interfaces, config.use_cpu)


def check_torch_loads() -> None:
    """Under a limit on what a process maps (ulimit -v, ulimit -d) torch may not even load: its
    libraries are mapped as it is imported, and one that cannot be may end the process in a C++
    abort, where no line can be said. So where such a limit is set, a command imports torch in a
    child process first (seconds); what a run needs besides is checked once it is loaded
    (launch/needs.py)."""
    mapping = tightest_mapping_limit()
    if mapping is None or "torch" in sys.modules:
        return
    tried = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True)
    if tried.returncode:
        raise UserError(f"torch cannot be loaded within {mapping}: {mapping.fix}")


def gpus_on_this_machine() -> int:
    from resnet50_trainer.distributed.devices import (
        gpus_on_this_machine as count,  # imports torch (seconds)
    )

    return count()


def _check_databases_exist(config: Config) -> None:
    paths = [("--test_data", config.test_data)]
    if not config.synthetic and not config.test_only:  # --test_only reads no training DB
        paths.insert(0, ("--train_data", config.train_data))
    for flag, path in paths:
        if path is None:
            continue
        check_reachable(flag, path)
        if not os.path.exists(path):
            synthetic = (
                " (or --train_data null for synthetic data)" if flag == "--train_data" else ""
            )
            raise UserError(
                f"{flag} {shown(path)} does not exist: give the path of an existing "
                f"{config.db_type} database{synthetic}"
            )
