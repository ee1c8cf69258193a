"""The engine's rooms stay as they were laid out.

* No function in ``commit/engine/`` is longer than :data:`MAX_FUNCTION_LINES`
  (measured with ``ast``, from its ``def`` to its last line, docstring included):
  a function that long holds several steps; give each its name.
* ``CommitHandler`` and its async twin are the four abstract methods plus
  ``read_manifest`` (and ``find_key`` for handlers that claim keys): no commit
  queue methods, flag or ``ticket=``. A commit queue is the handler's optional
  ``queue`` capability (``lancetx.commit.handlers.queue``).
* ``conflicts.py`` opens with the ``RULES`` table, readable against the spec:
  nothing is defined before it (the terms and the named conditions have their
  own modules).
* The commit loop (``committer.py``) does not wait for queue turns or load
  versions itself: ``turns.py``, ``loading.py`` and ``parents.py`` do.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from lancetx.commit.handlers.interface import AsyncCommitHandler, CommitHandler

ENGINE = Path(__file__).resolve().parent.parent.parent / "commit" / "engine"

#: The longest a function in the engine may be, in lines.
MAX_FUNCTION_LINES = 120


def _functions(path: Path) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]


def _top_level_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {
        node.name
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    }


def test_no_engine_function_is_longer_than_the_limit() -> None:
    modules = sorted(ENGINE.rglob("*.py"))
    assert len(modules) > 10  # the engine was found
    too_long = [
        f"{path.relative_to(ENGINE.parent.parent)}:{fn.lineno} {fn.name} "
        f"({(fn.end_lineno or fn.lineno) - fn.lineno + 1} lines)"
        for path in modules
        for fn in _functions(path)
        if (fn.end_lineno or fn.lineno) - fn.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not too_long, (
        f"functions over {MAX_FUNCTION_LINES} lines in commit/engine/ (split them into "
        f"named steps): {too_long}"
    )


@pytest.mark.parametrize("handler", [CommitHandler, AsyncCommitHandler])
def test_a_commit_handler_is_four_methods_and_read_manifest_with_the_queue_a_capability(
    handler: type,
) -> None:
    assert handler.__abstractmethods__ == {
        "resolve_latest",
        "resolve_version",
        "list_versions",
        "commit",
    }
    methods = {
        name
        for name, value in vars(handler).items()
        if not name.startswith("_") and callable(value)
    }
    assert methods == {
        "resolve_latest",
        "resolve_version",
        "list_versions",
        "commit",
        "read_manifest",
        "find_key",
    }
    assert list(inspect.signature(handler.commit).parameters) == [
        "self",
        "base",
        "version",
        "manifest",
        "scheme",
        "summary",
    ]
    flags = {name for name in vars(handler) if "ticket" in name or "turn" in name}
    assert not flags, f"queue flags on {handler.__name__}: {flags}"
    assert handler.queue is None  # type: ignore[attr-defined]  # no queue unless offered


def test_conflicts_opens_with_the_rules_table() -> None:
    tree = ast.parse((ENGINE / "conflicts.py").read_text())
    before_rules: list[str] = []
    for node in tree.body:
        targets = [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            targets.append(node.target.id)
        if "RULES" in targets:
            break
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            before_rules.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and targets != ["__all__"]:
            before_rules.extend(targets)
    else:
        pytest.fail("conflicts.py defines no RULES")
    assert not before_rules, f"defined in conflicts.py before RULES: {before_rules}"


def test_the_commit_loop_leaves_turns_and_loading_to_their_modules() -> None:
    loop = _top_level_names(ENGINE / "committer.py")
    turns = {"QueueTurn", "join_queue", "wait_for_turn", "end_turn_steps"}
    loading = {"Loaded", "load_newer", "load_listed", "load_key_winner"}
    parents = {"Parent", "load_parent_steps", "load_parent", "load_parent_async"}
    assert turns <= _top_level_names(ENGINE / "turns.py")
    assert loading <= _top_level_names(ENGINE / "loading.py")
    assert parents <= _top_level_names(ENGINE / "parents.py")
    assert not loop & (turns | loading | parents)
    assert not {name for name in loop if "turn" in name.lower() or "load" in name.lower()} - {
        "load_parent",  # the front doors: one call each into parents.py
        "load_parent_async",
    }
