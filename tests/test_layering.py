"""Imports point one way between the layers.

protos ← commit {errors ← storage ← format ← handlers ← engine} ← externalstore
← lancetx (front door, CLI) ← pyspark_lancetx

Every module of the source tree is parsed (not imported) and every ``import`` in
it is checked, wherever it sits: at the top, inside a function (a lazy import)
or under ``if TYPE_CHECKING:``. A module may import its own layer and the layers
below it, never one above. CONTRIBUTING.md ("Architecture") explains the layers.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Source folder -> the dotted package it installs as (pyproject's package-dir).
PACKAGES = {
    "protos": "lancetx.protos",
    "commit": "lancetx.commit",
    "externalstore": "lancetx.externalstore",
    "lancetx": "lancetx",
    "pyspark_lancetx": "pyspark_lancetx",
}

# Lowest first; the first prefix that matches a module names its layer.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("protos", ("lancetx.protos",)),
    ("commit (shared: errors)", ("lancetx.commit.errors",)),
    ("commit.storage", ("lancetx.commit.storage",)),
    ("commit.format", ("lancetx.commit.format",)),
    ("commit.handlers", ("lancetx.commit.handlers",)),
    ("commit.engine", ("lancetx.commit.engine",)),
    ("externalstore", ("lancetx.externalstore",)),
    ("lancetx (front door)", ("lancetx",)),
    ("pyspark_lancetx", ("pyspark_lancetx",)),
]
# Anything else directly under commit/ (its __init__) sits with the shared layer.
COMMIT_ROOT = "lancetx.commit"


def layer_of(module: str) -> int | None:
    """The rank of ``module``'s layer, or None for a module outside the project."""
    if module == COMMIT_ROOT or (
        module.startswith(COMMIT_ROOT + ".")
        and module.split(".")[2] not in ("storage", "format", "handlers", "engine")
    ):
        return 1  # lancetx.commit and the files directly under it
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                return rank
    return None


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    importer: str
    imported: str

    def __str__(self) -> str:
        low = LAYERS[layer_of(self.importer) or 0][0]
        high = LAYERS[layer_of(self.imported) or 0][0]
        return (
            f"{self.path}:{self.line}: {self.importer} ({low}) imports {self.imported} "
            f"({high}), a layer above it"
        )


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    package = PACKAGES[rel.parts[0]]
    parts = [package, *rel.parts[1:]]
    parts[-1] = parts[-1].removesuffix(".py")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, str]]:
    """Every module ``tree`` imports, with its line: top-level, lazy (inside a
    function) and TYPE_CHECKING imports alike. ``from p import x`` counts as
    ``p.x`` (x may be a submodule) -- the layer is the same either way unless x
    is a subpackage of a lower layer, which is what we want to see."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            for alias in node.names:
                found.append((node.lineno, f"{target}.{alias.name}"))
    return found


def violations_in(path: Path, source: str) -> list[Violation]:
    module = module_name(path)
    own = layer_of(module)
    assert own is not None, f"{path} is in no layer; add it to LAYERS"
    tree = ast.parse(source, filename=str(path))
    out = []
    for line, imported in imported_modules(tree, module, path.name == "__init__.py"):
        rank = layer_of(imported)
        if rank is not None and rank > own:
            out.append(Violation(str(path.relative_to(ROOT)), line, module, imported))
    return out


def source_files() -> list[Path]:
    files: list[Path] = []
    for folder in PACKAGES:
        if (ROOT / folder).is_dir():
            files.extend(
                p for p in sorted((ROOT / folder).rglob("*.py")) if not p.name.endswith("_pb2.py")
            )
    return files


def test_no_import_points_up_a_layer() -> None:
    files = source_files()
    assert len(files) > 50  # the tree was found
    found = [v for p in files for v in violations_in(p, p.read_text())]
    assert not found, "imports pointing up a layer:\n" + "\n".join(map(str, found))


@pytest.mark.parametrize(
    ("where", "source"),
    [
        ("commit/format/manifest.py", "from lancetx.commit.engine.builder import build_manifest"),
        ("commit/storage/s3store.py", "from ..format import naming"),
        ("commit/handlers/interface.py", "def f():\n    import lancetx.commit.engine.retry\n"),
        (
            "commit/errors.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from lancetx.commit.storage.objectstore import ObjectStore\n",
        ),
        ("commit/engine/committer.py", "from lancetx.externalstore import protocol"),
        ("externalstore/protocol.py", "from lancetx import open"),
        ("protos/__init__.py", "import lancetx.commit.errors"),
        ("lancetx/__init__.py", "from pyspark_lancetx import DefaultSource"),
    ],
)
def test_an_upward_import_is_caught(where: str, source: str) -> None:
    """The checker itself: each of these is an upward import (top-level,
    relative, lazy, TYPE_CHECKING)."""
    assert violations_in(ROOT / where, source), source


@pytest.mark.parametrize(
    ("where", "source"),
    [
        ("commit/engine/committer.py", "from lancetx.commit.format import naming"),
        ("commit/format/manifest.py", "from ..storage.objectstore import ObjectStore"),
        ("commit/storage/s3store.py", "from lancetx.commit.errors import LancetxError"),
        ("externalstore/protocol.py", "from lancetx.commit.engine import committer"),
        ("lancetx/__init__.py", "from lancetx.externalstore.connect import connect"),
    ],
)
def test_a_downward_import_is_allowed(where: str, source: str) -> None:
    assert not violations_in(ROOT / where, source), source


# --------------------------------------------------------------- Spark: the front door only

#: What the Spark data source may import from lancetx: the front door (``lancetx`` and the
#: names it exports) and the two error modules. Everything else it needs is front-door API.
SPARK_ALLOWED = ("lancetx.errors", "lancetx.commit.errors")
#: Modules leaving the package (issue 20, point 1: the demo moves out of the library).
SPARK_EXEMPT = ("pyspark_lancetx.demo",)


def front_door_names() -> set[str]:
    tree = ast.parse((ROOT / "lancetx" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            assert isinstance(node.value, ast.List)
            return {ast.literal_eval(e) for e in node.value.elts}
    raise AssertionError("lancetx/__init__.py has no __all__")


def spark_reaches_behind_the_front_door(path: Path, source: str) -> list[str]:
    module = module_name(path)
    names = front_door_names()
    tree = ast.parse(source, filename=str(path))
    out = []
    for line, imported in imported_modules(tree, module, path.name == "__init__.py"):
        if imported != "lancetx" and not imported.startswith("lancetx."):
            continue
        if imported == "lancetx" or imported.removeprefix("lancetx.") in names:
            continue  # ``import lancetx`` / ``from lancetx import Table``
        if any(imported == m or imported.startswith(m + ".") for m in SPARK_ALLOWED):
            continue
        out.append(f"{path.relative_to(ROOT)}:{line}: {module} imports {imported}")
    return out


def test_spark_uses_only_the_front_door_and_the_error_modules() -> None:
    files = [
        p
        for p in sorted((ROOT / "pyspark_lancetx").rglob("*.py"))
        if module_name(p) not in SPARK_EXEMPT
    ]
    assert len(files) > 5
    found = [v for p in files for v in spark_reaches_behind_the_front_door(p, p.read_text())]
    assert not found, "pyspark_lancetx reaches behind the front door:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("source", "allowed"),
    [
        ("import lancetx", True),
        ("from lancetx import Table, WrittenFiles", True),
        ("from lancetx.errors import ColumnMismatchError", True),
        ("from lancetx.commit.errors import LancetxError", True),
        ("def f():\n    from lancetx.state import TableState\n", False),
        ("from lancetx.externalstore.connect import connect", False),
        ("from lancetx.commit.engine.unreferenced import may_delete", False),
        ("from lancetx import history", False),
        ("import lancetx.table", False),
    ],
)
def test_the_spark_check_catches_a_back_door(source: str, allowed: bool) -> None:
    found = spark_reaches_behind_the_front_door(ROOT / "pyspark_lancetx" / "commit.py", source)
    assert (not found) == allowed, found
