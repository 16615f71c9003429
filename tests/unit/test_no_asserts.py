"""No `assert` in the package that input can reach: flags, environment and files end in a typed,
one-line error (errors.py), never in an AssertionError's traceback (nor pass unchecked under -O).
The few asserts left state internal invariants, each listed here with what guarantees it."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.trainer_runs import REPOSITORY

PACKAGE = Path(REPOSITORY) / "resnet50_trainer"

# (module, function) -> why input cannot reach it. Keep it short: a new entry needs a reason that
# no flag, variable or file can break.
INTERNAL_INVARIANTS = {
    # config/flags/outputs.py refuses --test_only without --load_model_path.
    ("train/evaluate_only.py", "_read_checkpoint"),
    # config/flags/optimisation.py makes --iter_size divide each process's batch, and batches
    # keep their size (data/batch.py fills an unreadable record's place).
    ("train/epoch_loop.py", "_train_step"),
    # A Record holds encoded bytes or pixels: built so by the parsers in this module alone.
    ("data/formats/images.py", "_file_bytes"),
    ("data/formats/records.py", "record_pixels"),
    # A read of a database this package closed: a bug of ours, not of the DB.
    ("data/formats/lmdb_reader.py", "_beginning"),
    # resnet50-db create's parser refuses a command line without exactly one of SOURCE and
    # --list_file.
    ("tools/db/build.py", "_tasks"),
    # torch.onnx.export returns the program it built when it is given no file to write: torch's
    # contract, whatever the checkpoint.
    ("tools/export/formats.py", "_write_onnx"),
}


def asserts_in_package() -> set[tuple[str, str, int]]:
    """(module, innermost enclosing function or "<module>", line) of every assert statement in
    the package."""
    found: set[tuple[str, str, int]] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        _Asserts(module, found).visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return found


class _Asserts(ast.NodeVisitor):
    def __init__(self, module: str, found: set[tuple[str, str, int]]) -> None:
        self.module, self.found, self.within = module, found, ["<module>"]

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.within.append(node.name)
        self.generic_visit(node)
        self.within.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Assert(self, node: ast.Assert) -> None:
        self.found.add((self.module, self.within[-1], node.lineno))


def test_every_assert_in_the_package_is_a_listed_internal_invariant():
    found = asserts_in_package()
    unlisted = sorted(
        f"{module}:{line} in {name}"
        for module, name, line in found
        if (module, name) not in INTERNAL_INVARIANTS
    )
    assert not unlisted, (
        "assert reachable from input? raise a typed error (errors.py) instead, or list it in "
        f"INTERNAL_INVARIANTS with what guarantees it: {unlisted}"
    )


def test_the_allow_list_names_only_asserts_that_exist():
    """A listed invariant whose assert went away leaves the list: it stays the list of what is."""
    present = {(module, name) for module, name, _ in asserts_in_package()}
    assert INTERNAL_INVARIANTS <= present, INTERNAL_INVARIANTS - present
