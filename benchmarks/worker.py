"""The measuring process that benchmarks/trees.py starts: `python -c BOOTSTRAP ROOT TREE
module:function ARGUMENTS_JSON`. The bootstrap imported this module from ROOT; here ROOT leaves
the path and TREE goes first, so `resnet50_trainer` is the tree's (checked), while this package's
modules, already found under ROOT, keep coming from there. The function's result is printed as one
JSON line after RESULT_PREFIX."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

RESULT_PREFIX = "benchmark result: "


def main() -> None:
    root, tree, target, arguments = sys.argv[1:5]
    sys.path.remove(root)
    sys.path.insert(0, tree)
    import resnet50_trainer

    found = Path(resnet50_trainer.__file__).resolve()
    if not found.is_relative_to(Path(tree).resolve()):
        raise SystemExit(f"resnet50_trainer came from {found}, not from the tree {tree}")
    module, _, function = target.partition(":")
    result = getattr(importlib.import_module(module), function)(**json.loads(arguments))
    print(RESULT_PREFIX + json.dumps(result), flush=True)
