"""Reading a run's CSV log: the one our trainer writes and the one Caffe2's resnet50_trainer.py
wrote.

Both have the same layout: an optional line 1 of `# ` + the arguments, the header line, one row per
epoch. The original stored its learning rate as a one-element numpy array (`[-0.1]`, negative
because Caffe2's SGD descends by adding lr x gradient); this reader takes the number out of the
brackets and leaves the sign as written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from resnet50_trainer.errors import UserError
from resnet50_trainer.reporting.runlog import HEADER, TOP5_COLUMN

# The writer's layout is the one definition of the format; TOP5_COLUMN may follow it (--log_top5).
LOG_COLUMNS = tuple(HEADER)

_LOG_NAME = re.compile(
    r"^(?P<model>resnet50|resnext\d+)_gpu(?P<gpus>\d+)_b(?P<batch>\d+)_L(?P<labels>\d+)_lr(?P<lr>-?\d+\.\d+)"
    r"_v2_(?P<stamp>\d{8}_\d{6})(_\d+)?\.log$"  # _2: a run that started in the same second
)
_BRACKETED_NUMBER = re.compile(r"^\[\s*([^\s\[\],]+)\s*\]$")
_HEADER_TEXT = ",".join(LOG_COLUMNS)
_SHOWN_CHARS = 60  # enough of a bad line to recognise it, short enough for a one-line error


@dataclass(frozen=True)
class RunLog:
    """One run log: where it is, its arguments line, its numbers and a legend label."""

    path: Path
    arguments: str | None  # the text after `#` on line 1; None when the log has no such line
    # each name of LOG_COLUMNS (and TOP5_COLUMN where the log has it) -> one value per epoch row
    columns: dict[str, list[float]]
    label: str

    @property
    def num_rows(self) -> int:
        return len(self.columns["epoch"])


def run_label(path: str | Path) -> str:
    """'2 GPUs, batch 64, 1000 labels, lr 0.10' from a log's file name, led by 'ResNeXt-50, ' for
    a ResNeXt's; the file name if it does not fit."""
    name = Path(path).name
    match = _LOG_NAME.match(name)
    if match is None:
        return name
    model = "" if match["model"] == "resnet50" else f"ResNeXt-{match['model'][7:]}, "
    return (
        f"{model}{_count(int(match['gpus']), 'GPU')}, batch {int(match['batch'])}, "
        f"{_count(int(match['labels']), 'label')}, lr {match['lr']}"
    )


def read_run_log(path: str | Path) -> RunLog:
    """Parse a run log; UserError (one line naming the file) when it is not one."""
    path = Path(path)
    lines = _read_lines(path)
    arguments = None
    header_index = 0
    if lines and lines[0].startswith("#"):
        arguments = lines[0][1:].strip()
        header_index = 1
    _check_header(path, lines, header_index)
    header = lines[header_index].strip().split(",")
    has_top5 = header[len(LOG_COLUMNS) : len(LOG_COLUMNS) + 1] == [TOP5_COLUMN]
    names = LOG_COLUMNS + ((TOP5_COLUMN,) if has_top5 else ())
    columns: dict[str, list[float]] = {name: [] for name in names}
    for index in range(header_index + 1, len(lines)):
        if lines[index].strip():
            _append_row(path, index + 1, lines[index], len(header), columns)
    return RunLog(path=path, arguments=arguments, columns=columns, label=run_label(path))


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _read_lines(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file; pass the path of a run log (*.log)") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory; pass the path of a run log (*.log)") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a text file, so not a run log") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if not text.strip():
        raise UserError(f"{path}: empty file, not a run log")
    return text.splitlines()


def _check_header(path: Path, lines: list[str], header_index: int) -> None:
    if header_index >= len(lines):
        raise UserError(
            f"{path}: has the arguments line but no header line after it; the run wrote nothing yet"
        )
    header = lines[header_index].strip().split(",")
    if tuple(header[: len(LOG_COLUMNS)]) != LOG_COLUMNS:
        raise UserError(
            f"{path}: line {header_index + 1} is not a run log header: expected '{_HEADER_TEXT}', "
            f"got {_shorten(lines[header_index])}"
        )


def _append_row(
    path: Path, line_number: int, line: str, num_cells: int, columns: dict[str, list[float]]
) -> None:
    cells = line.strip().split(",")
    if len(cells) != num_cells:
        raise UserError(
            f"{path}: line {line_number} has {len(cells)} values but the header has {num_cells} "
            f"(a line cut short while the run was writing?)"
        )
    for name, cell in zip(columns, cells):
        number = _parse_number(cell)
        if number is None:
            raise UserError(f"{path}: line {line_number}: {name} is not a number: {_shorten(cell)}")
        columns[name].append(number)


def _parse_number(cell: str) -> float | None:
    bracketed = _BRACKETED_NUMBER.match(cell.strip())
    text = bracketed.group(1) if bracketed else cell
    try:
        return float(text)
    except ValueError:
        return None


def _shorten(text: str) -> str:
    text = text.strip()
    return repr(text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "...")
