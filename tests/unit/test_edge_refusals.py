"""Refusals and reports at the edges, in one line each and one rule each (issue 24): a warm-up as
long as the run under every LR policy, a launcher variable that is not a number, resnet50-db dump's
--index from either end and its keys with control characters, resnet50-plot of many logs and of a
log named after a same-second collision. In this process: nothing here trains."""

from __future__ import annotations

import warnings
from typing import cast

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from resnet50_trainer.config.launchers import detect_launcher
from resnet50_trainer.config.lr_policies import LR_POLICIES
from resnet50_trainer.errors import UserError
from resnet50_trainer.tools.db.command import main as db_main
from resnet50_trainer.tools.plot.figure import LABEL_CHARS, LEGEND_ENTRIES, plot_logs
from resnet50_trainer.tools.plot.logfile import read_run_log
from tests.support.dbfactory import datum_record, make_jpeg, write_db, write_image_db
from tests.support.run_logs import ours_log
from tests.support.trainer_runs import config_of, refused_in_process

# What each policy needs besides the warm-up, so that the warm-up is the one thing refused.
POLICY_FLAGS = {
    "step": ("--lr_steps", "1"),
    "multistep": ("--lr_steps", "1"),
    "exp": ("--lr_gamma", "0.9"),
    "inv": ("--lr_gamma", "0.1", "--lr_power", "0.75"),
    "poly": ("--lr_power", "1"),
}


@pytest.mark.parametrize("warmup", ["3", "4.5"])
@pytest.mark.parametrize("policy", LR_POLICIES)
def test_a_warm_up_as_long_as_the_run_is_refused_under_every_policy(capsys, policy, warmup):
    line = refused_in_process(
        capsys,
        *("--train_data", "null", "--num_epochs", "3", "--warmup_epochs", warmup),
        *("--lr_policy", policy, *POLICY_FLAGS.get(policy, ())),
    )
    assert f"--warmup_epochs {warmup} leaves nothing of the 3 epochs" in line, line
    assert "shorten the warm-up to below 3 epochs or run longer" in line, line


def test_a_warm_up_shorter_than_the_run_is_accepted_under_every_policy():
    for policy in LR_POLICIES:
        flags = ("--num_epochs", "3", "--warmup_epochs", "2.9", "--lr_policy", policy)
        config = config_of(
            *("--use_cpu", "--train_data", "null"), *flags, *POLICY_FLAGS.get(policy, ())
        )
        assert config.warmup_epochs == 2.9


SRUN = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0"}


@pytest.mark.parametrize(
    "variable, value", [("SLURM_PROCID", "x"), ("SLURM_NTASKS", "-1"), ("SLURM_LOCALID", "1.5")]
)
def test_a_launcher_variable_that_is_not_a_number_is_named(variable, value):
    environ = {**SRUN, "SLURM_STEP_TASKS_PER_NODE": "1", variable: value}
    with pytest.raises(UserError) as refusal:
        detect_launcher(environ)
    message = str(refusal.value)
    assert f"{variable}={value!r} set by srun is not a whole number" in message, message
    assert f"unset {variable}" in message and "every machine" not in message, message


def test_uneven_tasks_per_node_still_ask_for_the_same_number_on_every_machine():
    with pytest.raises(UserError, match="start the same number of processes on every machine"):
        detect_launcher({**SRUN, "SLURM_NTASKS": "3", "SLURM_STEP_TASKS_PER_NODE": "2,1"})


@pytest.fixture
def five_records(tmp_path):
    """An LMDB of 5 JPEG records, the last of them under a key with a newline, a tab, an escape
    sequence and a line separator in it."""
    keys = [b"a", b"b", b"c", b"d", b"e\nnext line\tx\x1b[2J\xe2\x80\xa8"]
    records = [
        (key, datum_record(index, encoded=make_jpeg(seed=index))) for index, key in enumerate(keys)
    ]
    return write_db(str(tmp_path / "db"), "lmdb", records)


def dump(tmp_path, db, *which: str) -> int:
    return db_main(["dump", db, *which, "--out", str(tmp_path / "o.png")])


@pytest.mark.parametrize("index, label", [("0", 0), ("4", 4), ("-1", 4), ("-5", 0)])
def test_dump_index_counts_from_either_end(tmp_path, capsys, five_records, index, label):
    assert dump(tmp_path, five_records, "--index", index) == 0
    assert f"  label {label}  -> " in capsys.readouterr().out


@pytest.mark.parametrize("index", ["5", "-6", "-10", "99"])
def test_dump_index_out_of_range_states_the_rule_in_one_line(tmp_path, capsys, five_records, index):
    assert dump(tmp_path, five_records, "--index", index) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        f"resnet50-db dump: error: --index {index} is out of range: {five_records} holds 5 "
        "records, so --index takes 0..4 (or -5..-1, counted from the end)"
    ]


def test_dump_help_states_the_index_rule(capsys):
    with pytest.raises(SystemExit):
        db_main(["dump", "--help"])
    assert "-1 the last (negatives count from the end)" in " ".join(capsys.readouterr().out.split())


def test_dump_prints_a_key_s_control_characters_escaped_on_one_line(tmp_path, capsys, five_records):
    assert dump(tmp_path, five_records, "--index", "-1") == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "\x1b" not in out and "\u2028" not in out, repr(out)
    assert out.startswith("key e\\nnext line\\tx\\x1b[2J\\u2028  label 4  -> "), out


@pytest.mark.parametrize("count", [1, LEGEND_ENTRIES, LEGEND_ENTRIES + 1, 51])
def test_plots_of_any_number_of_logs_keep_their_panels_and_a_bounded_legend(tmp_path, count):
    """The runs' legend stands outside the panels and names at most LEGEND_ENTRIES lines, the
    last counting the rest; labels are cut short: the panels keep their size, matplotlib warns of
    nothing (it warned that the layout collapsed at 51 logs)."""
    long_directory = tmp_path / ("d" * 150)
    long_directory.mkdir()
    name = "resnet50_gpu1_b64_L1000_lr0.10_v2_20261121_101530.log"
    # The same parameters throughout: each label names its file's long path as well.
    logs = [
        ours_log(long_directory, name.replace("101530", f"{index:06d}")) for index in range(count)
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        figure = plot_logs(logs, tmp_path / "many.png", dpi=50)
    for axes in figure.axes:
        position = axes.get_position()
        assert position.width > 0.25 and position.height > 0.3, (axes.get_title(), position)
    (legend,) = figure.legends
    texts = [text.get_text() for text in legend.get_texts()]
    assert len(texts) == min(count, LEGEND_ENTRIES)
    assert all(len(text) <= LABEL_CHARS for text in texts), texts
    if count > LEGEND_ENTRIES:
        assert texts[-1] == f"... and {count - LEGEND_ENTRIES + 1} more runs"
    renderer = cast(FigureCanvasAgg, figure.canvas).get_renderer()  # build_figure attached it
    legend_box = legend.get_window_extent(renderer)
    assert all(not legend_box.overlaps(axes.get_window_extent(renderer)) for axes in figure.axes)


def test_a_log_named_after_a_same_second_collision_gets_its_run_s_label(tmp_path):
    log = ours_log(tmp_path, "resnet50_gpu2_b64_L1000_lr0.10_v2_20261121_101530_2.log")
    assert read_run_log(log).label == "2 GPUs, batch 64, 1000 labels, lr 0.10"


@pytest.mark.parametrize(
    "flags, arithmetic",
    [
        (("--batch_size", "1"), "--batch_size 1 / 1 processes / --iter_size 1"),
        (("--batch_size", "2", "--num_gpus", "2"), "--batch_size 2 / 2 processes / --iter_size 1"),
        (("--batch_size", "4", "--iter_size", "4"), "--batch_size 4 / 1 processes / --iter_size 4"),
    ],
)
def test_a_training_pass_of_one_image_at_32_px_is_refused(flags, arithmetic):
    """BatchNorm in training normalises a channel over a pass's images and the last stage's
    positions (1x1 at 32 px): one value, which torch refused mid-run in a 90-line traceback."""
    with pytest.raises(UserError) as refused:
        config_of("--use_cpu", "--train_data", "null", "--image_size", "32", *flags)
    assert str(refused.value).startswith(f"a training pass holds 1 image ({arithmetic}) and at "), (
        refused.value
    )
    assert "give a pass 2 images or more" in str(refused.value)


def test_a_training_pass_of_one_image_is_accepted_where_the_last_stage_is_larger(tmp_path):
    """At 33 px the last stage is 2x2; --test_only trains nothing."""
    test_data = write_image_db(str(tmp_path / "test"), 2, 1)
    for flags in (
        ("--image_size", "33"),
        ("--test_only", "--load_model_path", "x.pt", "--test_data", test_data),
    ):
        config = config_of("--use_cpu", "--train_data", "null", "--batch_size", "1", *flags)
        assert config.device_batch_size == 1


def test_an_epoch_smaller_than_a_global_batch_names_the_epoch_size():
    """Refused before the DB is opened, and the DB not blamed: the epoch is what is short."""
    with pytest.raises(UserError) as refused:
        config_of("--use_cpu", "--train_data", "null", "--batch_size", "16", "--epoch_size", "8")
    assert str(refused.value) == (
        "--epoch_size 8 is less than one global batch of 16 (--batch_size 16): raise "
        "--epoch_size to 16 or more, or lower --batch_size"
    )


def test_a_profile_of_an_evaluation_alone_is_refused(tmp_path):
    """--test_only trains nothing, so --profile_iters would have no step to profile: said, not
    ignored."""
    test_data = write_image_db(str(tmp_path / "test"), 2, 1)
    with pytest.raises(UserError) as refused:
        config_of(
            *("--use_cpu", "--train_data", "null", "--test_only", "--load_model_path", "x.pt"),
            *("--test_data", test_data, "--profile_iters", "3"),
        )
    assert str(refused.value) == (
        "--profile_iters profiles training steps and --test_only trains none: leave "
        "--profile_iters out"
    )
