"""The package's imports flow one way: downward through its layers (folders), and no module
imports one that (directly or not) imports it, an import under `if TYPE_CHECKING:` counted too
(the flag groups declare, and config/checks.py, which reads Config, checks)."""

from __future__ import annotations

import ast
import os
import re

from tests.support.trainer_runs import REPOSITORY

PACKAGE = "resnet50_trainer"


def package_imports() -> dict[str, set[str]]:
    """Each module of the package -> the package's modules it imports (at any depth of its code,
    under `if TYPE_CHECKING:` too)."""
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


# The layers from the bottom up: a module imports only its own folder and the folders before it.
# The top-level modules (cli, __main__) come last, the two commands' tools/ after them.
LAYERS = (
    "cpython_private",
    "machine",
    "limits",
    "errors",
    "path_words",
    "lifecycle",
    "streams",
    "commands",
    "data",
    "config",
    "distributed",
    "model",
    "checkpoint",
    "reporting",
    "train",
    "launch",
    "cli",
    "tools",
)


def layer_of(module: str) -> str | None:
    """The layer a module of the package belongs to: its folder, or its own name at the top
    (`resnet50_trainer` itself and `__main__` sit above everything)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def upward_imports(imports: dict[str, set[str]]) -> list[str]:
    """Each import of a module in a layer above the importer's, as "importer -> imported"."""
    found = []
    for module, imported in sorted(imports.items()):
        below = layer_of(module)
        for name in sorted(imported):
            above = layer_of(name)
            if below and above and LAYERS.index(above) > LAYERS.index(below):
                found.append(f"{module} -> {name}")
    return found


def test_every_module_sits_in_a_layer():
    unplaced = [m for m in package_imports() if layer_of(m) is None and m.count(".") > 0]
    assert unplaced == [f"{PACKAGE}.__main__"]


def test_no_module_imports_a_layer_above_its_own():
    assert upward_imports(package_imports()) == []


def test_an_upward_import_is_found():
    imports = {
        f"{PACKAGE}.data.records": {f"{PACKAGE}.config.settings", f"{PACKAGE}.errors"},
        f"{PACKAGE}.train.run": {f"{PACKAGE}.model.resnet"},
    }
    assert upward_imports(imports) == [f"{PACKAGE}.data.records -> {PACKAGE}.config.settings"]


def named_in_architecture_page() -> set[str]:
    """The package paths docs/architecture.md names in backticks, modules and folders: those in a
    layer's folder, and the top's modules (the page also names tests/ and scripts/ files)."""
    with open(os.path.join(REPOSITORY, "docs", "architecture.md")) as file:
        page = file.read()
    return {
        path
        for path in re.findall(r"`([a-z_/]+(?:\.py|/))`", page)
        if path.split("/")[0] in LAYERS or path.removesuffix(".py") in (*LAYERS, "__main__")
    }


def test_the_architecture_page_names_every_module_and_nothing_else():
    named = named_in_architecture_page()
    root = os.path.join(REPOSITORY, PACKAGE)
    modules = {
        os.path.relpath(os.path.join(folder, name), root)
        for folder, _, names in os.walk(root)
        for name in names
        if name.endswith(".py") and name != "__init__.py"
    }
    unnamed = {
        module
        for module in modules
        if module not in named and not any(module.startswith(f) for f in named if f.endswith("/"))
    }
    assert unnamed == set()
    stale = {path for path in named if not os.path.exists(os.path.join(root, path))}
    assert stale == set()
