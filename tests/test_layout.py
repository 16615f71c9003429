"""The package's imports flow one way: no module imports one that (directly or not) imports it."""

from __future__ import annotations

import ast
import os

from trainer_runs import REPOSITORY

PACKAGE = "resnet50_trainer"


def package_imports() -> dict[str, set[str]]:
    """Each module of the package -> the package's modules it imports (at any depth of its code)."""
    root = os.path.join(REPOSITORY, PACKAGE)
    modules = {}
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path[: -len(".py")], REPOSITORY).replace(os.sep, ".")
                modules[dotted.removesuffix(".__init__")] = path
    imports = {}
    for module, path in modules.items():
        with open(path) as file:
            tree = ast.parse(file.read())
        named = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                named |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.Import):
                named |= {alias.name for alias in node.names}
        imports[module] = {name for name in named if name in modules and name != module}
    return imports


def cycle_through(imports: dict[str, set[str]]) -> list[str] | None:
    """One import cycle between modules (packages' __init__ aside), or None."""
    packages = {module for module in imports if any(m.startswith(module + ".") for m in imports)}
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return path[path.index(module) :] + [module]
        if module in done:
            return None
        for imported in sorted(imports[module] - packages):
            found = visit(imported, [*path, module])
            if found:
                return found
        done.add(module)
        return None

    for module in sorted(imports):
        found = visit(module, [])
        if found:
            return found
    return None


def test_the_package_has_no_import_cycle():
    assert cycle_through(package_imports()) is None


def test_a_cycle_is_found():
    assert cycle_through({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
