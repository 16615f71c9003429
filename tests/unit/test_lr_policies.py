"""--lr_policy and its flags: each policy's LR at given iterations, from the flags through the
Config, and the refusals of flags a policy does not read or needs."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from resnet50_trainer.config.flags.parser import flag_actions
from resnet50_trainer.config.lr_policies import POLICIES, POLICY_FLAGS
from resnet50_trainer.model.lr_schedule import LearningRateSchedule
from tests.support.trainer_runs import SMALL_RUN, config_of, refused_in_process

# SMALL_RUN's global batch is 8; with --lr_scaling none the base LR is the LR.
RUN = (*SMALL_RUN, "--train_data", "null", "--lr_scaling", "none", "--num_epochs", "4")
PER_EPOCH = 10


def schedule_of(*flags: str) -> LearningRateSchedule:
    return LearningRateSchedule.of(config_of(*RUN, *flags), PER_EPOCH)


def test_the_default_is_the_originals_step_policy():
    schedule = schedule_of("--base_learning_rate", "0.4", "--num_epochs", "100")
    assert [schedule(i) for i in (0, 299, 300, 599, 600)] == [
        0.4,
        0.4,
        0.4 * 0.1,
        0.4 * 0.1,
        0.4 * 0.1**2,
    ]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda policy: policy.name)
def test_a_policy_says_whether_its_lr_depends_on_the_run_s_length(policy):
    # The resume's warning names these as the policies --num_epochs changes.
    needed = {
        "lr_steps": ("--lr_steps", "1"),
        "lr_gamma": ("--lr_gamma", "0.5"),
        "lr_power": ("--lr_power", "0.75"),
    }
    flags = ("--lr_policy", policy.name, *(arg for name in policy.needs for arg in needed[name]))
    lrs = [schedule_of(*flags, "--num_epochs", epochs)(15) for epochs in ("4", "8")]
    assert (lrs[0] != lrs[1]) == policy.by_run_length, lrs


def test_step_and_multistep_drop_at_their_epochs():
    step = schedule_of("--lr_steps", "1.5", "--lr_gamma", "0.5")
    assert [step(i) for i in (14, 15, 29, 30)] == [0.1, 0.05, 0.05, 0.025]
    # floor(e / step) of the manual's table (docs/recipes.md), with a step of 0.25 epochs = 2.5
    # iterations.
    quarter = schedule_of("--lr_steps", "0.25", "--lr_gamma", "0.5")
    assert [round(math.log2(0.1 / quarter(i))) for i in range(8)] == [0, 0, 0, 1, 1, 2, 2, 2]
    multi = schedule_of("--lr_policy", "multistep", "--lr_steps", "1", "3", "--lr_gamma", "0.2")
    assert [multi(i) for i in (9, 10, 29, 30, 39)] == pytest.approx([0.1, 0.02, 0.02, 0.004, 0.004])


def test_cosine_and_poly_decay_from_the_warm_up_to_min_lr_at_the_end():
    cosine = schedule_of("--lr_policy", "cosine", "--warmup_epochs", "1", "--min_lr", "0.01")
    assert [cosine(i) for i in (0, 4)] == pytest.approx([0.1 / 10, 0.1 * 5 / 10])
    assert cosine(10) == pytest.approx(0.1)  # the warm-up's end: the decay starts at the peak
    assert cosine(25) == pytest.approx(0.01 + 0.09 * 0.5)  # half way through the decay
    assert cosine(40) == pytest.approx(0.01)
    poly = schedule_of("--lr_policy", "poly", "--lr_power", "2")
    assert [poly(i) for i in (0, 20, 40)] == pytest.approx([0.1, 0.1 * 0.25, 0.0])


def test_exp_and_inv_follow_caffes_formulas_per_epoch():
    exp = schedule_of("--lr_policy", "exp", "--lr_gamma", "0.5")
    assert [exp(i) for i in (0, 10, 15)] == pytest.approx([0.1, 0.05, 0.1 * 0.5**1.5])
    inv = schedule_of("--lr_policy", "inv", "--lr_gamma", "2", "--lr_power", "0.75")
    assert inv(5) == pytest.approx(0.1 * (1 + 2 * 0.5) ** -0.75)
    assert schedule_of("--lr_policy", "fixed")(39) == 0.1


def test_the_lr_is_a_function_of_the_iteration_alone():
    """What exact resume relies on: a new schedule (a resumed run's) gives the same LRs."""
    flags = ("--lr_policy", "cosine", "--warmup_epochs", "0.5")
    first, second = schedule_of(*flags), schedule_of(*flags)
    backwards = [second(i) for i in reversed(range(40))]  # no state carried between calls
    assert [first(i) for i in range(40)] == backwards[::-1]
    assert all(math.isfinite(first(i)) and first(i) > 0 for i in range(40))


@pytest.mark.parametrize(
    "flags, words",
    [
        (("--lr_policy", "cosine", "--lr_gamma", "0.1"), "--lr_gamma is not read by"),
        (("--lr_policy", "step", "--min_lr", "0.01"), "--min_lr is not read by --lr_policy step"),
        (("--lr_policy", "multistep"), "--lr_policy multistep needs --lr_steps"),
        (("--lr_policy", "exp"), "--lr_policy exp needs --lr_gamma"),
        (("--lr_policy", "inv", "--lr_gamma", "1"), "--lr_policy inv needs --lr_power"),
        (("--lr_steps", "10", "20"), "takes one --lr_steps value"),
        (("--lr_policy", "multistep", "--lr_steps", "20", "10"), "increasing order"),
        (("--lr_gamma", "2"), "--lr_gamma 2 is above 1"),
        (("--lr_policy", "cosine", "--min_lr", "5"), "--min_lr 5 is above the run's LR"),
        (("--lr_policy", "poly", "--warmup_epochs", "1000"), "leaves nothing of the 1000 epochs"),
        (("--lr_steps", "0"), "--lr_steps: invalid value '0'"),
        (("--lr_steps", "nan"), "--lr_steps: invalid value 'nan'"),
        (("--lr_gamma", "inf"), "--lr_gamma: invalid value 'inf'"),
        (("--lr_policy", "sigmoid"), "--lr_policy: invalid choice"),
        (("--momentum", "1"), "--momentum: invalid value '1'"),
        (("--momentum", "0"), "--optimizer nesterov needs momentum"),
        (("--iter_size", "3"), "--iter_size 3 splits each process's batch of 8"),
    ],
)
def test_lr_and_optimizer_flags_that_do_not_fit_are_one_line(capsys, flags, words):
    line = refused_in_process(capsys, "--train_data", "null", *flags)
    assert words in line, line


@pytest.mark.parametrize("policy", POLICIES, ids=lambda policy: policy.name)
def test_each_registry_entry_is_whole_and_read_by_the_flags_and_the_schedule(policy):
    """config/lr_policies.py: an entry is a choice of --lr_policy, named in its help and the help
    of each flag it reads, and with its needed flags runs a warm-up, then an LR that never rises."""
    assert set(policy.needs) <= set(policy.reads) <= set(POLICY_FLAGS)
    assert bool(policy.steps_help) == ("lr_steps" in policy.reads)
    if policy.caffe is not None:
        in_epochs = [policy.caffe.in_epochs[0]] if policy.caffe.in_epochs else []
        fields = [field for field, _ in policy.caffe.as_written] + in_epochs
        assert set(fields) <= set(policy.caffe.reads)
    actions = flag_actions()
    assert policy.name in (actions["lr_policy"].choices or ())
    assert policy.name in (actions["lr_policy"].help or "")
    for flag in policy.reads:
        assert policy.name in (actions[flag].help or ""), flag
    needed = {"lr_steps": ("1",), "lr_gamma": ("0.5",), "lr_power": ("0.5",)}
    flags = [arg for flag in policy.needs for arg in (f"--{flag}", *needed[flag])]
    schedule = schedule_of("--lr_policy", policy.name, "--warmup_epochs", "1", *flags)
    assert schedule.describe().endswith(", after 1 warm-up epochs")
    lrs = [schedule(i) for i in range(40)]
    assert lrs[0] <= 0.1 / 10 + 1e-12 and all(0 <= lr <= 0.1 for lr in lrs)
    assert lrs[:10] == sorted(lrs[:10]) and lrs[9:] == sorted(lrs[9:], reverse=True)


def test_the_caffe_guide_lists_the_solver_policies_the_registry_honours():
    guide = (Path(__file__).parents[2] / "docs" / "from-caffe.md").read_text()
    [listed] = re.findall(r"\*\*Honoured\*\*: base_lr, lr_policy \(([^)]*)\)", guide)
    assert sorted(listed.split(", ")) == sorted(policy.name for policy in POLICIES if policy.caffe)
