"""Imports point one way between the layers.

protos ← commit {errors ← storage ← format ← handlers ← engine} ← externalstore
← lancetx (front door, CLI) ← pyspark_lancetx ← demo (the demos, the embedded server)

Every module of the source tree is parsed (not imported) and every ``import`` in
it is checked, wherever it sits: at the top, inside a function (a lazy import)
or under ``if TYPE_CHECKING:``. A module may import its own layer and the layers
below it, never one above. CONTRIBUTING.md ("Architecture") explains the layers.
"""

from __future__ import annotations

import ast
import itertools
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
    "demo": "lancetx.demo",
}

# Lowest first; the longest prefix that matches a module names its layer.
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
    # The demos and the embedded server: they compose every layer, none imports them.
    ("demo", ("lancetx.demo",)),
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
    matches = [
        (len(prefix), rank)
        for rank, (_, prefixes) in enumerate(LAYERS)
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    return max(matches)[1] if matches else None


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


# ------------------------------------------------------------------ import cycles


def project_modules() -> dict[str, Path]:
    """Every module of the source tree, by its dotted name."""
    return {module_name(p): p for p in source_files()}


def import_graph(
    modules: dict[str, Path] | None = None,
) -> dict[str, dict[str, list[int]]]:
    """Module -> the project modules it imports -> the lines that do, counting every
    ``import`` wherever it sits (top level, inside a function, under TYPE_CHECKING).
    ``from p import x`` is an edge to ``p.x`` when that is a module, else to ``p``."""
    modules = project_modules() if modules is None else modules
    graph: dict[str, dict[str, list[int]]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        edges: dict[str, list[int]] = {}
        for line, imported in imported_modules(tree, module, path.name == "__init__.py"):
            target = imported
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != module:
                edges.setdefault(target, []).append(line)
        graph[module] = edges
    return graph


def import_cycles(graph: dict[str, dict[str, list[int]]]) -> list[list[str]]:
    """One cycle (first module repeated at the end) per group of modules that import
    each other, directly or through others (Tarjan's strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph.get(module, {})):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return [_cycle_in(group, graph) for group in groups]


def _cycle_in(group: list[str], graph: dict[str, dict[str, list[int]]]) -> list[str]:
    """A shortest cycle through the group's first module, inside the group."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        module = queue.pop(0)
        for target in sorted(graph[module]):
            if target == start:
                return [*paths[module], start]
            if target in members and target not in paths:
                paths[target] = [*paths[module], target]
                queue.append(target)
    raise AssertionError(f"no cycle through {start}")  # a strongly connected group has one


def describe_cycle(cycle: list[str], graph: dict[str, dict[str, list[int]]]) -> str:
    modules = project_modules()
    steps = []
    for importer, imported in itertools.pairwise(cycle):
        path = modules[importer].relative_to(ROOT)
        lines = ",".join(map(str, graph[importer][imported]))
        steps.append(f"  {importer} ({path}:{lines}) imports {imported}")
    return "\n".join(steps)


def test_no_import_cycle() -> None:
    """No module imports itself through others, not even through an import inside a
    function: a cycle held apart by a lazy import is a layering the code did not find."""
    graph = import_graph()
    assert len(graph) > 50  # the tree was found
    cycles = import_cycles(graph)
    assert not cycles, f"{len(cycles)} import cycle(s):\n" + "\n\n".join(
        describe_cycle(c, graph) for c in cycles
    )


def test_a_cycle_is_caught() -> None:
    """The cycle finder itself: a lazy import closing a loop of three is found."""
    graph = {
        "a": {"b": [1]},
        "b": {"c": [2]},
        "c": {"a": [9]},  # e.g. inside a function
        "d": {"a": [1]},
    }
    assert import_cycles(graph) == [["a", "b", "c", "a"]]
    assert import_cycles({"a": {"b": [1]}, "b": {}}) == []


# ------------------------------------------------------------ the DynamoDB room

DYNAMODB = "lancetx.externalstore.dynamodb"
#: Who may import the DynamoDB store's package from outside it: the scheme table (every
#: door opens tables through it) and the operator tools that work on DynamoDB itself.
DYNAMODB_IMPORTERS = {
    "lancetx.externalstore.connect": "the scheme table",
    "lancetx.ops.create_table": "creates and stamps the DynamoDB table",
    "lancetx.ops.doctor": "checks the DynamoDB table and its IAM grants",
    "lancetx.ops.iam_policy": "names the DynamoDB items a role may touch",
    "lancetx.ops.items": "reads and writes DynamoDB items by hand",
    "lancetx.ops.status": "reports the DynamoDB store's layout stamp",
    "lancetx.ops.table": "the tools' view of a table: its DynamoDB store",
}


def imports_of_the_dynamodb_room(
    graph: dict[str, dict[str, list[int]]],
) -> list[str]:
    """Every import of ``lancetx.externalstore.dynamodb`` (or a module in it) from a module
    outside it that is not one of :data:`DYNAMODB_IMPORTERS` or a demo."""
    modules = project_modules()
    found = []
    for importer, edges in sorted(graph.items()):
        if importer == DYNAMODB or importer.startswith(DYNAMODB + "."):
            continue
        if importer in DYNAMODB_IMPORTERS or importer.startswith("lancetx.demo"):
            continue
        for imported, lines in sorted(edges.items()):
            if imported == DYNAMODB or imported.startswith(DYNAMODB + "."):
                path = modules[importer].relative_to(ROOT) if importer in modules else importer
                found.append(f"{path}:{lines[0]}: {importer} imports {imported}")
    return found


def test_only_the_scheme_table_and_the_dynamodb_tools_import_the_dynamodb_store() -> None:
    """Nothing outside ``externalstore/dynamodb/`` reaches into it but ``connect.py`` and
    the operator tools that work on DynamoDB: every other door opens tables through the
    scheme table, so a second external store is a second row there, not a hunt."""
    found = imports_of_the_dynamodb_room(import_graph())
    assert not found, (
        "imports of externalstore/dynamodb/ from outside it (open the table through "
        "lancetx.externalstore.connect instead):\n" + "\n".join(found)
    )


def test_an_import_of_the_dynamodb_room_is_caught() -> None:
    """The check itself: a lazy import from the front door is found, the scheme table's is not."""
    graph = {
        "lancetx.aio": {"lancetx.externalstore.dynamodb.store_async": [61]},
        "lancetx.externalstore.connect": {"lancetx.externalstore.dynamodb.store": [40]},
        "lancetx.externalstore.dynamodb.store": {"lancetx.externalstore.dynamodb.plans": [12]},
    }
    found = imports_of_the_dynamodb_room(graph)
    assert found == [
        "lancetx/aio.py:61: lancetx.aio imports lancetx.externalstore.dynamodb.store_async"
    ]


# --------------------------------------------------------------- Spark: the front door only

#: What the Spark data source may import from lancetx: the front door (``lancetx`` and the
#: names it exports) and the two error modules. Everything else it needs is front-door API.
SPARK_ALLOWED = ("lancetx.errors", "lancetx.commit.errors")


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
    files = sorted((ROOT / "pyspark_lancetx").rglob("*.py"))
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
        ("from lancetx import version_history", False),
        ("import lancetx.table", False),
    ],
)
def test_the_spark_check_catches_a_back_door(source: str, allowed: bool) -> None:
    found = spark_reaches_behind_the_front_door(ROOT / "pyspark_lancetx" / "commit.py", source)
    assert (not found) == allowed, found
