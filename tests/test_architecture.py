"""The package's shape, read from its source: imports point down the floors of bnn/__init__.py's
list, and each concern has one home (the environment, the compiler, the CPU, custom gradients,
the bit layout, errors)."""

import ast
import re
from pathlib import Path

import pytest

from support import ROOT

PACKAGE = ROOT / "bnn"
# From the bottom: a module may import its own room and the floors below.
FLOORS = [
    {"errors", "catalog", "progress", "files"},
    {"settings"},
    {"native"},
    {"ops"},
    {"quantizers"},
    {"layers"},
    {"models", "optimizers"},
    {"train", "packed", "larq"},
    {"tools"},
    {"cli"},
]
FLOOR = {room: level for level, rooms in enumerate(FLOORS) for room in rooms}
SOURCES = sorted(path for path in PACKAGE.rglob("*.py")
                 if path.name not in ("__init__.py", "__main__.py") or path.parent != PACKAGE)


def _room(module: str) -> str:
    """``bnn.layers.dense`` -> ``layers``; ``bnn.errors`` -> ``errors``."""
    return module.split(".")[1]


def _module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The bnn modules a file imports, at any depth of its code."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("bnn.")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "bnn":
                found |= {f"bnn.{alias.name}" for alias in node.names}
            elif node.module.startswith("bnn."):
                found.add(node.module)
    return found


def _text(path: Path) -> str:
    return path.read_text()


def test_every_room_of_the_package_has_a_floor():
    rooms = {_room(_module_of(path)) for path in SOURCES}
    assert rooms == set(FLOOR), rooms ^ set(FLOOR)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path):
    here = _room(_module_of(path))
    upward = sorted(module for module in _imports(path)
                    if _room(module) != here and FLOOR[_room(module)] >= FLOOR[here])
    assert not upward, f"{path.relative_to(ROOT)} ({here}) imports {upward}"


def _files_with(pattern: str) -> set[str]:
    regex = re.compile(pattern)
    return {str(path.relative_to(PACKAGE)) for path in SOURCES if regex.search(_text(path))}


@pytest.mark.parametrize("pattern, home", [
    (r"os\.environ|getenv\(", {"settings.py"}),
    (r"\bsubprocess\b|load_op_library", {"native/build.py"}),
    (r"/proc/cpuinfo|list_physical_devices\(\"GPU\"\)|platform\.machine", {"native/dispatch.py"}),
    (r"tf\.custom_gradient", {"ops/gradients.py"}),
    (r"packbits|unpackbits|bitorder=", {"ops/bitpack.py"}),
    (r"^(PRECISIONS|DATASETS|OPTIMIZERS|LOSSES|SCHEDULES|KERNEL_VARIANTS)\s*[:=]",
     {"catalog.py"}),
], ids=["environment", "compiler and library", "cpu and gpu", "custom gradients", "bit layout",
        "name tables"])
def test_each_concern_has_one_home(pattern, home):
    flags = re.MULTILINE if pattern.startswith("^") else 0
    regex = re.compile(pattern, flags)
    found = {str(path.relative_to(PACKAGE)) for path in SOURCES if regex.search(_text(path))}
    assert found == home


def test_error_classes_live_in_errors():
    defined = {}
    for path in SOURCES:
        for node in ast.walk(ast.parse(_text(path))):
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(base, ast.Name) and base.id.endswith(("Error", "Exception"))
                    for base in node.bases):
                defined[node.name] = str(path.relative_to(PACKAGE))
    assert defined and set(defined.values()) == {"errors.py"}, defined


def test_every_quantizer_is_a_gradient_override():
    """The quantizers define no gradient of their own: each goes through bnn.ops.gradients."""
    for path in (PACKAGE / "quantizers").glob("*.py"):
        tree = ast.parse(_text(path))
        used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
        assert "custom_gradient" not in used and "GradientTape" not in used, path.name
