"""The flags of what a run writes and reads back: logs, checkpoints (their names, retention,
frequency), resume and auto-resume, evaluate-only, initial weights, the profiler and the console;
checked in checks.py. Part of the one parser (parser.py)."""

from __future__ import annotations

from resnet50_trainer.config.flags.declare import FlagGroup, flag, flag_group
from resnet50_trainer.config.values import (
    Number,
    Switch,
    path_value,
)

COUNT_FROM_0 = Number(int, 0)


COUNT_FROM_1 = Number(int, 1)


# The profiler holds a step's events in memory until the profile ends, and its analysis reads them
# all back (thousands a step on a GPU, megabytes): a few steps tell where the time goes.
PROFILED_STEPS = Number(int, 0, 100)


@flag_group
class OutputFlags(FlagGroup):
    """Logs; then where checkpoints go, how many stay, how often; what a run starts from or
    scores."""

    TITLE = "logs and checkpoints"

    log_dir: str = flag(type=path_value, if_absent=".")
    """directory of the CSV run log"""
    profile_iters: int = flag(type=PROFILED_STEPS, if_absent=0)
    """profile N steps after 20 warm-up steps with torch.profiler: one line says where their time
    went (GPU busy, or idle waiting for input, host overhead, syncs); a table and a gzipped Chrome
    trace next to the log"""
    print_every: int = flag(type=COUNT_FROM_1, if_absent=100)
    """print the original's iteration and loss lines every N iterations"""
    log_top5: bool = flag(action=Switch)
    """add a top5_test_accuracy column to the run log (the console shows top-5 anyway; without it
    the log keeps the original's columns)"""
    tensorboard: bool = flag(action=Switch)
    """also write TensorBoard event files (the log's columns per epoch; loss, accuracy, LR and input
    wait every --print_every steps) in --log_dir/tensorboard/<run>/, steps counted in global
    iterations, continued by a resume; view with tensorboard --logdir <log_dir>"""
    # its default, log_dir, worked out by config/build.py
    checkpoint_dir: str = flag(type=path_value)
    """directory of checkpoints (default: --log_dir)"""
    save_model_name: str = flag(if_absent="resnet50_model")
    """checkpoint name stem"""
    load_model_path: str | None = flag(type=path_value)
    """checkpoint to continue training from"""
    # The newest checkpoint of checkpoint_dir, if any, wins over load_model_path.
    auto_resume: bool = flag(action=Switch)
    """continue from the newest usable checkpoint of this --checkpoint_dir and --save_model_name
    when there is one, else start as the other flags say (for torchrun --max-restarts, a Slurm
    requeue, a Kubernetes restart)"""
    keep_checkpoints: int = flag(type=COUNT_FROM_1, if_absent=1)
    """how many of the newest checkpoints to keep"""
    checkpoint_every_iters: int = flag(type=COUNT_FROM_0, if_absent=0)
    """also checkpoint every N iterations within an epoch (0: only at epoch ends)"""
    test_only: bool = flag(action=Switch)
    """evaluate the --load_model_path checkpoint on the whole --test_data DB, print its test
    accuracy, and stop: nothing is trained or written"""
    init_model: str | None = flag(type=path_value, metavar="PATH")
    """start a fresh run from these weights (Caffe's --weights): one of our checkpoints or a
    torch.save(model.state_dict()) file; a classifier of another --num_labels is replaced by a fresh
    one"""
