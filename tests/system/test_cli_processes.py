"""The command in a fresh interpreter: a bad flag is one line and exit 2 with no traceback, --help
and refusals import no torch, the launcher of several processes no training code, --help reads
well, a training process leaves without the interpreter's teardown."""

from __future__ import annotations

import os
import subprocess
import sys

from resnet50_trainer.cli import build_parser
from resnet50_trainer.config.values import Number
from tests.support.original_flags import ORIGINAL_FLAGS
from tests.support.trainer_runs import (
    RUN_TIMEOUT_S,
    SMALL_RUN,
    imported_by,
    run_python,
    trainer_env,
)


def test_bad_flag_exits_2_with_one_line_and_no_traceback(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "resnet50_trainer",
            "--train_data",
            str(tmp_path / "missing_db"),
            "--use_cpu",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "missing_db does not exist" in lines[0]
    assert list(tmp_path.iterdir()) == []  # nothing was written


def test_help_reads_well():
    result = subprocess.run(
        [sys.executable, "-m", "resnet50_trainer", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "REDIS_PASSWORD": "hunter2"},
    )
    assert result.returncode == 0
    for flag in ORIGINAL_FLAGS:
        assert flag in result.stdout
    text = " ".join(result.stdout.split())
    for action in build_parser()._actions:  # each number flag's valid range, as it is checked
        if isinstance(action.type, Number) and not action.choices:
            assert f"(valid: {action.type.describe()})" in text, action.dest
    assert "(default: None)" not in text
    assert "hunter2" not in result.stdout  # $REDIS_PASSWORD is the flag's default, never shown


def test_help_and_refusals_do_not_import_torch():
    """--help and a refused flag answer at once: torch's import (seconds) waits until the flags
    hold."""
    argvs = [
        ["--help"],
        ["--train_data", "x", "--batch_size", "nan"],
        ["--train_data", "/nonexistent", "--use_cpu"],
    ]
    assert imported_by("resnet50_trainer.cli", argvs, ("torch", "torchvision")) == []


def test_the_launcher_of_several_processes_imports_no_training_code(image_db, tmp_path):
    """It trains nothing: torchvision and dynamo (~3 s of CPU a process) are imported once, by the
    fork server its training processes are forked from."""
    database = image_db("train", 16, 4)
    probe = (
        "import sys\n"
        "from resnet50_trainer.cli import main\n"
        "status = main(sys.argv[1:])\n"
        "training = ('torchvision', 'torch._dynamo', 'resnet50_trainer.train.trainer')\n"
        "print(status, sorted(name for name in sys.modules if name in training))\n"
    )
    flags = ["--num_gpus", "2", "--train_data", database, "--num_epochs", "1"]
    outputs = ["--checkpoint_dir", str(tmp_path), "--log_dir", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "-c", probe, *SMALL_RUN, *flags, *outputs],
        capture_output=True,
        text=True,
        env=trainer_env(),
        timeout=RUN_TIMEOUT_S,
    )
    assert done.stdout.splitlines()[-1] == "0 []", done.stderr
    assert (tmp_path / "resnet50_model_1.pt").exists()


def test_a_training_process_leaves_without_the_interpreters_teardown():
    """lifecycle.leave: exit handlers run and output is flushed, the status is kept, and nothing is
    torn down after (where a Gloo thread freeing a collective would abort the process)."""
    script = (
        "import atexit, sys\n"
        "from resnet50_trainer.lifecycle import leave\n"
        "class TornDown:\n"
        "    def __del__(self):\n"
        "        print('torn down', flush=True)\n"
        "kept = TornDown()\n"  # a module's global: freed only by the interpreter's teardown
        "atexit.register(print, ' exit handler')\n"
        "sys.stdout.write('buffered')\n"
        "leave(3)\n"
    )
    done = run_python(script)
    assert (done.returncode, done.stdout, done.stderr) == (3, "buffered exit handler\n", "")
