"""The one catch list: every public lancetx error is exported by ``lancetx.errors`` and
``lancetx``, and the error trees drawn in the error modules' docstrings are the real
hierarchy (every class there, no stale name, each under one of its bases, ``*`` exactly
on the ``retryable`` ones)."""

from __future__ import annotations

import importlib
import pkgutil
import re
from types import ModuleType

import pytest

import lancetx
import lancetx.commit.errors
import lancetx.errors
import lancetx.externalstore.errors
from lancetx.commit.errors import LancetxError

PACKAGES = ("lancetx", "pyspark_lancetx")


def _import_everything() -> None:
    for name in PACKAGES:
        package = importlib.import_module(name)
        for info in pkgutil.walk_packages(package.__path__, f"{name}."):
            if not info.name.endswith("__main__"):
                importlib.import_module(info.name)


def public_errors() -> dict[str, type[LancetxError]]:
    """Every public subclass of LancetxError defined by the library, by name."""
    _import_everything()
    found: dict[str, type[LancetxError]] = {}
    todo: list[type[LancetxError]] = [LancetxError]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            todo.append(sub)
            if sub.__name__.startswith("_") or not sub.__module__.startswith(PACKAGES):
                continue
            other = found.setdefault(sub.__name__, sub)
            assert other is sub, f"two public errors named {sub.__name__}: {other} and {sub}"
    return found


_NODE = re.compile(r"^(?P<indent>(?:[│ ]   )*)(?:[├└]── )?(?P<name>\w+)(?P<star> \*)?(?:\s|$)")


def tree_of(module: ModuleType) -> list[tuple[int, str, bool]]:
    """``(depth, name, starred)`` for each line of the tree in ``module``'s docstring
    (the indented block that starts with ``LancetxError``)."""
    doc = module.__doc__ or ""
    lines = doc.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "LancetxError")
    margin = len(lines[start]) - len(lines[start].lstrip())
    nodes = [(0, "LancetxError", False)]
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        match = _NODE.match(line[margin:])
        assert match is not None, f"{module.__name__}: cannot read tree line {line!r}"
        depth = len(match["indent"]) // 4 + 1
        nodes.append((depth, match["name"], match["star"] is not None))
    return nodes


def check_tree(module: ModuleType, required: set[str]) -> None:
    errors = public_errors() | {"LancetxError": LancetxError}
    nodes = tree_of(module)
    names = [name for _, name, _ in nodes]
    assert len(names) == len(set(names)), f"{module.__name__}: a class drawn twice"
    stale = sorted(set(names) - set(errors))
    assert not stale, f"{module.__name__}'s tree names classes that do not exist: {stale}"
    missing = sorted(required - set(names))
    assert not missing, f"{module.__name__}'s tree lacks {missing}"
    parents: list[str] = []
    for depth, name, starred in nodes:
        del parents[depth:]
        cls = errors[name]
        if parents:
            parent = errors[parents[-1]]
            assert issubclass(cls, parent), (
                f"{module.__name__}: {name} is drawn under {parent.__name__}, which is not "
                f"one of its bases ({[b.__name__ for b in cls.__mro__[1:-3]]})"
            )
        assert starred == cls.retryable, (
            f"{module.__name__}: {name} is {'not ' if not cls.retryable else ''}retryable, "
            f"but the tree {'marks' if starred else 'does not mark'} it with *"
        )
        parents.append(name)


def test_every_public_error_is_in_the_catch_list() -> None:
    errors = public_errors()
    assert len(errors) > 80
    for name, cls in sorted(errors.items()):
        assert name in lancetx.errors.__all__, f"{name} ({cls.__module__}) not in lancetx.errors"
        assert getattr(lancetx.errors, name) is cls
        assert name in lancetx.__all__, f"{name} ({cls.__module__}) not in lancetx.__all__"
        assert getattr(lancetx, name) is cls
    assert "LancetxError" in lancetx.__all__ and lancetx.LancetxError is LancetxError
    # Nothing else is exported as an error.
    exported = {n for n in lancetx.errors.__all__ if n != "LancetxError"}
    assert exported == set(errors)


def test_the_whole_tree_is_drawn_in_lancetx_errors() -> None:
    check_tree(lancetx.errors, set(public_errors()))


@pytest.mark.parametrize(
    ("module", "layer"),
    [
        (lancetx.commit.errors, "lancetx.commit."),
        (lancetx.externalstore.errors, "lancetx.externalstore."),
    ],
    ids=["commit", "externalstore"],
)
def test_each_layer_draws_its_own_errors(module: ModuleType, layer: str) -> None:
    own = {name for name, cls in public_errors().items() if cls.__module__.startswith(layer)}
    check_tree(module, own)


def test_tree_check_catches_a_stale_or_misplaced_name() -> None:
    """The checker itself fails on the drifts it exists for."""

    class Fake(ModuleType):
        pass

    stale = Fake("stale")
    stale.__doc__ = "x::\n\n    LancetxError\n    └── TableNotFoundError\n"
    with pytest.raises(AssertionError, match="do not exist"):
        check_tree(stale, set())
    misplaced = Fake("misplaced")
    misplaced.__doc__ = (
        "x::\n\n    LancetxError\n    └── FormatError\n        └── SchemaConversionError\n"
    )
    with pytest.raises(AssertionError, match="not one of its bases"):
        check_tree(misplaced, set())
    unmarked = Fake("unmarked")
    unmarked.__doc__ = (
        "x::\n\n    LancetxError\n    └── CommitError\n        └── RetriesExhaustedError\n"
    )
    with pytest.raises(AssertionError, match="does not mark"):
        check_tree(unmarked, set())


def test_retryable_marks_the_transient_family() -> None:
    retryable = {name for name, cls in public_errors().items() if cls.retryable}
    assert retryable == {
        "AmbiguousWriteError",
        "CommitStateUnknownError",
        "EndpointUnreachableError",
        "JobCommitTimeoutError",
        "JobCommitUnknownError",
        "ManifestCopyMismatchError",
        "RetriesExhaustedError",
        "RetryableConflictError",
        "ServiceUnavailableError",
        "ThrottledError",
        "TransientObjectStoreError",
        "UnfinishedParentError",
    }
    assert LancetxError.retryable is False
    assert "retryable" in (LancetxError.__doc__ or "")


def test_names_do_not_collide() -> None:
    """One name per meaning: "Table" in an error name is a Lance table unless it says
    DynamoDB, and no two names differ only in number."""
    names = set(public_errors())
    stale = {
        "TableNotFoundError",
        "TableSchemaError",
        "VersionsAlreadyExistError",
        "EntriesExistError",
    }
    assert not stale & names
    words = [re.findall(r"[A-Z][a-z]*", n) for n in names]
    singular = {
        "".join(re.sub(r"ies$", "y", w) if w.endswith("ies") else w.rstrip("s") for w in ws)
        for ws in words
    }
    assert len(singular) == len(names), "two error names differ only in number"
