"""The later original's flags (imagenet_trainer.py): --test_epoch_size, top-5 test accuracy,
--image_mean_per_channel / --image_std_per_channel, the ResNeXt flags and depth 200."""

from __future__ import annotations

import pytest
import torch
import torchvision

from resnet50_trainer.checkpoint.schema import check_matches
from resnet50_trainer.errors import UserError
from resnet50_trainer.model.precision import Precision, PrecisionSettings
from resnet50_trainer.model.resnet import build_model, build_split_model
from resnet50_trainer.reporting.runlog import log_file_name
from resnet50_trainer.train.evaluation import _correct_in_top
from tests.support.trainer_runs import config_of, refused_in_process

CPU_PAIR = (torch.device("cpu"), torch.device("cpu"))


def test_top5_counts_labels_among_the_five_best_and_all_with_fewer_labels():
    logits = torch.tensor([[9.0, 8, 7, 6, 5, 4], [0, 1, 2, 3, 4, 5], [5, 4, 3, 2, 1, 0]])
    # Row 0: label 4 is fifth (top-5 only); row 1: label 5 first; row 2: label 5 last (neither).
    assert _correct_in_top(logits, torch.tensor([4, 5, 5])).tolist() == [1.0, 2.0]
    # Three labels: every label is among the top 5.
    assert _correct_in_top(logits[:, :3], torch.tensor([2, 0, 1])).tolist() == [0.0, 3.0]


def test_the_per_channel_values_normalise_in_rgb_order_given_blue_first():
    config = config_of(
        *("--train_data", "null", "--use_cpu"),
        *("--image_mean_per_channel", "10,20,30", "--image_std_per_channel", "1", "2", "4"),
    )
    images = torch.full((1, 3, 2, 2), 100, dtype=torch.uint8)
    inputs = Precision(PrecisionSettings.of(config), torch.device("cpu")).inputs(images)
    # Red (channel 0 of ours) takes the last values given: (100 - 30) / 4.
    assert inputs[0, :, 0, 0].tolist() == [70 / 4, 80 / 2, 90 / 1]


def test_without_the_per_channel_flags_inputs_are_the_original_s():
    config = config_of("--train_data", "null", "--use_cpu", "--num_channels", "1")
    images = torch.tensor([[[[0, 128, 255]]]], dtype=torch.uint8)
    inputs = Precision(PrecisionSettings.of(config), torch.device("cpu")).inputs(images)
    assert inputs.tolist() == [[[[-1.0, 0.0, 127 / 128]]]]


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--image_mean_per_channel", "104,117"], "has 2 values for --num_channels 3"),
        (["--image_mean_per_channel", "1", "2", "3", "4"], "has 4 values"),
        (["--num_channels", "1", "--image_std_per_channel", "1,2,3"], "--num_channels 1"),
        (["--image_mean_per_channel", "nan,1,2"], "argument --image_mean_per_channel"),
        (["--image_mean_per_channel", "1,inf,2"], "each a number from 0 to 255"),
        (["--image_mean_per_channel", "300,1,2"], "from 0 to 255"),
        (["--image_mean_per_channel", "1,,2"], "invalid value"),
        (["--image_mean_per_channel", ""], "invalid value"),
        (["--image_std_per_channel", "0,1,1"], "each a number above 0"),
        (["--image_std_per_channel", "1", "-1", "1"], "argument --image_std_per_channel"),
        (["--image_std_per_channel"], "expected at least one argument"),
        (["--resnext_num_groups", "0"], "argument --resnext_num_groups"),
        (["--resnext_width_per_group", "0"], "argument --resnext_width_per_group"),
        (["--resnext_num_groups", "32"], "ResNet-18 has none"),  # SMALL_RUN is ResNet-18
        (["--num_layers", "34", "--resnext_width_per_group", "4"], "ResNet-34 has none"),
        (["--test_epoch_size", "0"], "argument --test_epoch_size"),
        (["--test_epoch_size", "-8"], "argument --test_epoch_size"),
        (["--num_layers", "100"], "invalid choice"),
    ],
)
def test_bad_values_are_refused_in_one_line(flags, named, capsys):
    assert named in refused_in_process(capsys, "--train_data", "null", *flags)


def test_a_checkpoint_from_before_the_resnext_flags_holds_a_plain_resnet():
    state = {"path": "old.pt", "arguments": {"num_layers": 50, "num_labels": 4, "num_channels": 3}}
    plain = ("--train_data", "null", "--use_cpu", "--num_layers", "50", "--num_labels", "4")
    check_matches(state, config_of(*plain))
    with pytest.raises(UserError, match="--resnext_width_per_group 64, this run has 4"):
        check_matches(state, config_of(*plain, "--resnext_width_per_group", "4"))


def test_the_log_is_named_after_a_resnext_only():
    common = ("--train_data", "null", "--use_cpu", "--batch_size", "64")
    assert log_file_name(config_of(*common), 0).startswith("resnet50_gpu1_b64_L1000_lr0.10_v2_")
    wide = config_of(*common, "--num_layers", "101", "--resnext_width_per_group", "128")
    assert log_file_name(wide, 0).startswith("resnext101_gpu1_b64_L1000_lr0.10_v2_")


def _bottleneck_resnet_parameters(blocks: list[int], labels: int, groups=1, width=64) -> int:
    """torchvision's ResNet with Bottleneck blocks, counted by hand: convolutions have no bias,
    every BN a weight and a bias per channel."""
    count = 3 * 64 * 7 * 7 + 2 * 64  # stem
    inplanes = 64
    for stage, num_blocks in enumerate(blocks):
        planes = 64 * 2**stage
        inner, out = planes * width // 64 * groups, planes * 4
        for block in range(num_blocks):
            count += inplanes * inner + inner * (inner // groups) * 9 + inner * out
            count += 2 * (2 * inner + out)
            if block == 0:  # the projection shortcut
                count += inplanes * out + 2 * out
            inplanes = out
    return count + 2048 * labels + labels


def test_the_parameter_count_formula_holds_for_torchvision_s_own_models():
    for stock, blocks, groups, width in (
        (torchvision.models.resnet50, [3, 4, 6, 3], 1, 64),
        (torchvision.models.resnext50_32x4d, [3, 4, 6, 3], 32, 4),
    ):
        with torch.device("meta"):
            parameters = sum(p.numel() for p in stock(num_classes=10).parameters())
        assert parameters == _bottleneck_resnet_parameters(blocks, 10, groups, width)


def test_depth_200_is_the_original_s_bottleneck_layout():
    with torch.device("meta"):  # shapes only: 64.7 million parameters, none allocated
        model = build_model(200, 1000, 3)
    assert [len(getattr(model, f"layer{i}")) for i in range(1, 5)] == [3, 24, 36, 3]
    parameters = sum(p.numel() for p in model.parameters())
    assert parameters == _bottleneck_resnet_parameters([3, 24, 36, 3], 1000) == 64_673_832


def test_a_model_parallel_resnext_matches_the_unsplit_one():
    torch.manual_seed(0)
    split = build_split_model(50, 4, 3, CPU_PAIR, groups=32, width_per_group=4).eval()
    unsplit = build_model(50, 4, 3, groups=32, width_per_group=4).eval()
    unsplit.load_state_dict(split.state_dict(), strict=True)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(split(images), unsplit(images))
