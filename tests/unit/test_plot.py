"""resnet50-plot and the run-log reader, on small logs written here in both trainers' formats."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from resnet50_trainer.errors import UserError
from resnet50_trainer.tools.plot.command import main
from resnet50_trainer.tools.plot.figure import PANELS, plot_logs
from resnet50_trainer.tools.plot.logfile import LOG_COLUMNS, read_run_log
from tests.support.run_logs import HEADER, NO_TEST, OURS_NAME, ours_log, row, write_log

ORIGINAL_NAME = "resnet50_gpu1_b32_L10_lr0.01_v2_20170601_080000.log"


def original_log(directory: Path) -> Path:
    """Caffe2's log: Namespace arguments, epochs from 0, the LR as a negated numpy array, no test
    data."""
    rows = [
        row(0, 2.3, 0.1, NO_TEST, "[-0.01]"),
        row(1, 2.0, 0.2, NO_TEST, "[-0.01]"),
        row(2, 1.8, 0.3, NO_TEST, "[ -1.00000005e-03]"),
    ]
    namespace = (
        "Namespace(base_learning_rate=0.01, batch_size=32, num_gpus=1, num_labels=10, "
        "test_data=None)"
    )
    return write_log(directory / ORIGINAL_NAME, rows, arguments=namespace)


def axes_by_title(figure):
    return {axes.get_title(): axes for axes in figure.axes}


def test_one_log_png_size_and_panels(tmp_path):
    output = tmp_path / "one.png"
    figure = plot_logs([ours_log(tmp_path)], output, dpi=50)

    with Image.open(output) as image:
        assert image.format == "PNG"
        assert image.size == (600, 400)  # 12 x 8 inches at 50 dpi
    assert [(axes.get_title(), axes.get_ylabel()) for axes in figure.axes] == list(PANELS)
    lines_per_panel = [len(axes.lines) for axes in figure.axes]
    assert lines_per_panel == [1, 2, 1, 1]  # accuracy: training + test
    legend = figure.legends[0]
    assert [text.get_text() for text in legend.get_texts()] == [
        "2 GPUs, batch 64, 1000 labels, lr 0.10"
    ]


def test_two_logs_overlay_with_a_legend_entry_each(tmp_path):
    output = tmp_path / "two.png"
    figure = plot_logs(
        [ours_log(tmp_path), original_log(tmp_path)], output, dpi=40, title="compare"
    )

    with Image.open(output) as image:
        assert image.size == (480, 320)
    panels = axes_by_title(figure)
    for title in ("Training loss", "Learning rate", "Throughput"):
        assert len(panels[title].lines) == 2
    # Two training curves, and test points only for the run that had test data.
    assert len(panels["Accuracy: training and test"].lines) == 3
    legend_texts = [text.get_text() for text in figure.legends[0].get_texts()]
    assert legend_texts == [
        "2 GPUs, batch 64, 1000 labels, lr 0.10",
        "1 GPU, batch 32, 10 labels, lr 0.01",
    ]
    # Figure.get_suptitle is matplotlib 3.8+ (pyproject allows 3.7); the stubs omit _suptitle.
    suptitle = figure._suptitle  # type: ignore[attr-defined]
    assert suptitle.get_text() == "compare"


def test_no_test_accuracy_rows_are_not_plotted(tmp_path):
    figure = plot_logs([ours_log(tmp_path)], tmp_path / "out.png", dpi=20)
    test_line = axes_by_title(figure)["Accuracy: training and test"].lines[1]

    assert list(test_line.get_xdata()) == [1, 3]
    assert list(test_line.get_ydata()) == [0.08, 0.25]


def test_original_log_is_read_and_its_learning_rate_plotted_as_magnitude(tmp_path):
    path = original_log(tmp_path)
    log = read_run_log(path)

    assert log.arguments is not None and log.arguments.startswith(
        "Namespace(base_learning_rate=0.01"
    )
    assert log.columns["epoch"] == [0, 1, 2]
    assert log.columns["learning_rate"] == pytest.approx([-0.01, -0.01, -0.001])
    assert log.columns["test_accuracy"] == [NO_TEST] * 3
    assert log.label == "1 GPU, batch 32, 10 labels, lr 0.01"
    figure = plot_logs([path], tmp_path / "out.png", dpi=20)
    lr_axes = axes_by_title(figure)["Learning rate"]
    assert list(lr_axes.lines[0].get_ydata()) == pytest.approx([0.01, 0.01, 0.001])
    assert lr_axes.get_yscale() == "log"


def test_log_without_arguments_line_and_with_extra_columns(tmp_path):
    rows = [row(1, 6.8, 0.1, NO_TEST) + ",extra-a", row(2, 6.1, 0.2, NO_TEST) + ",extra-b"]
    path = write_log(tmp_path / "my run.log", rows, arguments=None, header=HEADER + ",hostname")
    log = read_run_log(path)

    assert log.arguments is None
    assert log.num_rows == 2
    assert set(log.columns) == set(LOG_COLUMNS)
    # The name does not fit the pattern: the file name is the label.
    assert log.label == "my run.log"


def test_runs_with_equal_parameters_are_told_apart_by_path(tmp_path):
    # The original wrote one log per shard, all with the same name.
    for shard in ("shard0", "shard1"):
        (tmp_path / shard).mkdir()
    first, second = ours_log(tmp_path / "shard0"), ours_log(tmp_path / "shard1")
    figure = plot_logs([first, second], tmp_path / "out.png", dpi=20)

    legend_texts = [text.get_text() for text in figure.legends[0].get_texts()]
    assert legend_texts == [f"{shard}/{OURS_NAME}" for shard in ("shard0", "shard1")]


def test_main_writes_default_output_and_says_where(tmp_path, monkeypatch, capsys):
    log = ours_log(tmp_path)
    monkeypatch.chdir(tmp_path)
    main([str(log)])

    assert (tmp_path / "plot.png").is_file()
    assert capsys.readouterr().out.strip() == "wrote plot.png"


GOOD_ROW = row(1, 6.8, 0.1, NO_TEST)
# case -> (file name, content, what the error line must say)
BAD_FILES: dict[str, tuple[str, str | bytes, str]] = {
    "not_a_log": ("notes.txt", "hello, this is not a run log\n", "not a run log header"),
    "wrong_header": ("wrong.log", f"# args\ntime_spent,epoch,loss\n{GOOD_ROW}\n", "line 2"),
    "non_numeric_cell": (
        "nan.log",
        f"{HEADER}\n{row(1, 'oops', 0.1, NO_TEST)}\n",
        "loss is not a number",
    ),
    "short_row": ("cut.log", f"{HEADER}\n{GOOD_ROW}\n10.0,10.0,12\n", "line 3 has 3 values"),
    "empty": ("empty.log", "", "empty file"),
    "arguments_only": ("args.log", "# Namespace(batch_size=32)\n", "no header line"),
    "binary": ("image.log", bytes(range(256)), "not a text file"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES) + ["missing"])
def test_bad_file_exits_2_with_one_line_naming_it(tmp_path, capsys, case):
    if case == "missing":
        path, expected = tmp_path / "absent.log", "no such file"
    else:
        name, content, expected = BAD_FILES[case]
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    output = tmp_path / "out.png"

    assert main([str(ours_log(tmp_path)), str(path), "-o", str(output)]) == 2
    stderr_lines = capsys.readouterr().err.strip().splitlines()
    assert len(stderr_lines) == 1
    assert stderr_lines[0].startswith(f"resnet50-plot: error: {path}: ")
    assert expected in stderr_lines[0]
    assert not output.exists()


def test_log_with_no_rows_yet_is_refused(tmp_path):
    path = write_log(tmp_path / OURS_NAME, rows=[])
    with pytest.raises(UserError, match="no epoch rows yet"):
        plot_logs([path], tmp_path / "out.png")


@pytest.mark.parametrize("options", [["-o", "out.jpg"], ["--dpi", "0"], ["--dpi", "many"]])
def test_bad_options_exit_2(tmp_path, capsys, options):
    with pytest.raises(SystemExit) as exit_info:
        main([str(ours_log(tmp_path))] + options)
    assert exit_info.value.code == 2
    assert "resnet50-plot: error: argument" in capsys.readouterr().err


def test_unwritable_output_exits_2(tmp_path, capsys):
    assert main([str(ours_log(tmp_path)), "-o", str(tmp_path / "no_such_dir" / "out.png")]) == 2
    assert "cannot be written" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["run $5 $x^{.log", "_private run.log", "$$.log"])
def test_log_names_and_titles_are_drawn_literally(tmp_path, capsys, name):
    log = ours_log(tmp_path, name)
    title = "cost $5 \\frac{ and $x^"  # unbalanced mathtext: a parse error if not literal
    output = tmp_path / "out.png"
    figure = plot_logs([log], output, dpi=20, title=title)
    legend = figure.legends[0]
    assert [text.get_text() for text in legend.get_texts()] == [name]
    # Figure.get_suptitle is matplotlib 3.8+ (pyproject allows 3.7); the stubs omit _suptitle.
    suptitle = figure._suptitle  # type: ignore[attr-defined]
    assert suptitle.get_text() == title
    with Image.open(output) as image:
        assert image.size == (240, 160)
    main([str(log), "-o", str(output), "--title", title])
    assert capsys.readouterr().out.strip() == f"wrote {output}"
