"""Paths named in prose exist: every repository path that a docstring, comment, doc or script
names (`resnet50_trainer/data/transforms.py`, `tests/support/`, a package-relative
`config/flags/data.py` or `support/gpu.py`, a bare module name like `settings.py`, a Markdown link
like `[speed](../BENCHMARKS.md)`) names a file or folder that is there, so a move into folders that
forgets a reference fails here instead of leaving the reader a path to nowhere."""

from __future__ import annotations

import os
import re
import subprocess

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = "resnet50_trainer"

# The folders a path written from the repository's root starts with: such a path is checked even
# without an extension (`tests/system`, `sample_data/train_lmdb`).
ROOTS = (PACKAGE, "tests", "scripts", "benchmarks", "docs", "sample_data", "examples", ".ci")
# A package-relative path is resolved from these folders in turn, then from the naming file's.
BASES = ("", PACKAGE, "tests")
EXTENSIONS = "py|md|sh|json|c|toml|txt|cfg|yaml|sbatch|log|png|proto"

# A path: not inside a word, URL, shell variable (`$out/x.md`), absolute path, placeholder
# (`<gpu>.json`, `{name}`) or glob (`*.json`). It has a folder part and ends in a known extension or
# a slash, or it starts at one of ROOTS. A bare file name is only checked as a module (`lock.py`).
_OUTSIDE = r"[\w./:<>{}*$@%~-]"
PATH = re.compile(
    rf"(?<!{_OUTSIDE})"
    rf"((?:\.ci|[A-Za-z_][\w.-]*)(?:/[\w.-]+)*(?:\.(?:{EXTENSIONS})|/)"
    rf"|(?:{'|'.join(re.escape(root) for root in ROOTS)})(?:/[\w-]+)+)"
    r"(?![\w/<>{}*$-]|\.\w)"
)
URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+")
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")
# A name a test gives a file it writes (`tmp_path / "x.py"`) is no reference.
WRITTEN = re.compile(r"/ ['\"]$")

# The unavoidable: paths that are not this repository's files.
ALLOWED = {
    # Caffe2's example scripts, which this trainer follows and its docs cite by name.
    "resnet50_trainer.py",
    "imagenet_trainer.py",
    "lmdb_create_example.py",
    # The file names of the protobuf descriptors that protos.py and caffe_solver.py build: names
    # in protobuf's descriptor pool, not files.
    f"{PACKAGE}/caffe.proto",
    f"{PACKAGE}/caffe2.proto",
    f"{PACKAGE}/caffe_solver.proto",
}


def tracked_files() -> list[str]:
    """The repository's files (relative paths): git's list, or a walk of ROOTS without git."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=REPOSITORY, capture_output=True, check=True
        ).stdout
        return [name for name in listed.decode().split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        found = [
            name
            for name in os.listdir(REPOSITORY)
            if os.path.isfile(os.path.join(REPOSITORY, name))
        ]
        for root in ROOTS:
            for folder, folders, names in os.walk(os.path.join(REPOSITORY, root)):
                folders[:] = [name for name in folders if name != "__pycache__"]
                found += [os.path.relpath(os.path.join(folder, n), REPOSITORY) for n in names]
        return found


def holds_prose(name: str) -> bool:
    return name == ".ci/run" or name.endswith((".py", ".md", ".sh", ".toml", ".cfg"))


class Checker:
    """What paths a file's text names, and which of them are not in the repository."""

    def __init__(self, files: list[str]):
        self.basenames = {os.path.basename(name) for name in files}
        # The folders a package-relative path may start with: any folder of the repository's.
        self.folders = {part for name in files for part in name.split("/")[:-1]}
        self.checked = 0

    def exists(self, path: str, naming_file: str) -> bool:
        bases = [*BASES, os.path.dirname(naming_file)]
        return any(os.path.exists(os.path.join(REPOSITORY, base, path)) for base in bases)

    def stale(self, naming_file: str, text: str) -> list[tuple[int, str]]:
        """(line, path) for each path that `text`, the contents of `naming_file`, names that does
        not exist."""
        found = []
        markdown = naming_file.endswith(".md")
        for number, line in enumerate(text.splitlines(), 1):
            line = URL.sub(" ", line)
            if markdown:
                for target in MARKDOWN_LINK.findall(line):
                    path = target.partition("#")[0]
                    if not path or re.match(r"[a-z]+:", path):
                        continue
                    self.checked += 1
                    if not os.path.exists(
                        os.path.join(REPOSITORY, os.path.dirname(naming_file), path)
                    ):
                        found.append((number, path))
                line = MARKDOWN_LINK.sub("]", line)
            for match in PATH.finditer(line):
                path = match.group(1)
                if path in ALLOWED:
                    continue
                if "/" not in path:
                    if not path.endswith(".py") or WRITTEN.search(line[: match.start()]):
                        continue
                    self.checked += 1
                    if path not in self.basenames:
                        found.append((number, path))
                    continue
                first = path.split("/")[0]
                if first not in ROOTS and first not in self.folders:
                    continue  # another project's path, or a folder a run makes (`out/`)
                self.checked += 1
                if not self.exists(path, naming_file):
                    found.append((number, path))
        return found


def test_every_path_named_in_prose_exists():
    """No path named in prose is missing; a failure lists each, one a line, with the file and
    line that name it."""
    files = tracked_files()
    checker = Checker(files)
    stale = []
    for name in sorted(filter(holds_prose, files)):
        with open(os.path.join(REPOSITORY, name), encoding="utf-8") as file:
            text = file.read()
        stale += [f"{name}:{line}: {path}" for line, path in checker.stale(name, text)]
    assert checker.checked > 100  # the scan found the paths the prose names
    assert not stale, "paths named that do not exist:\n" + "\n".join(stale)


def test_a_stale_path_is_found():
    """A missing path is named, in each form; what is no path here (a URL, an absolute path, a
    shell variable, a placeholder, a glob, a run's output, a file a test writes) is not."""
    checker = Checker(tracked_files())
    # Written in pieces, so that this file names no missing path itself.
    missing, nowhere, checks = (
        f"{PACKAGE}/model/" + "no_such_helper" + ".py",
        "config/flags/nowhere" + ".py",
        "no_such_checks" + ".py",
    )
    text = (
        f'"""The helper in {missing} and data/transforms.py."""\n'
        f"# See {nowhere}, support/gpu.py, tests/support/hooks/ and {checks}.\n"
        "# Not paths: https://github.com/x/y/blob/z.py, /tmp/tests/x.py, $out/x.md, <gpu>.json,\n"
        "# benchmarks/results/*.json, out/gpu_check.md; written: tmp_path / 'helper.py'.\n"
    )
    assert checker.stale(f"{PACKAGE}/model/optim.py", text) == [
        (1, missing),
        (2, nowhere),
        (2, checks),
    ]
    link = "See [speed](../BENCHMARKS.md#speed), [data](data.md) and [gone](../GONE.md).\n"
    assert checker.stale("docs/speed.md", link) == [(1, "../GONE.md")]
