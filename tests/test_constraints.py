"""constraints.txt is the lock: exactly the distributions a venv of ``lancetx[dev]`` holds,
at the versions installed here, plus the pip the Makefile upgrades to first. A pin that
nothing installs any more (a stale lock) or a dependency without a pin fails here."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not an exact pin"
            pins[canonicalize_name(name)] = version
    return pins


def _closure(root: str, extras: set[str]) -> set[str]:
    """Every distribution ``root[extras]`` needs, transitively, on this interpreter."""
    seen: set[str] = set()
    pending: list[tuple[str, frozenset[str]]] = [(root, frozenset(extras))]
    while pending:
        name, wanted = pending.pop()
        for text in importlib.metadata.requires(name) or []:
            requirement = Requirement(text)
            environments = [{"extra": e} for e in wanted] or [{"extra": ""}]
            if requirement.marker is not None and not any(
                requirement.marker.evaluate(env) for env in environments
            ):
                continue
            key = canonicalize_name(requirement.name)
            if key == canonicalize_name(root):  # lancetx[async,embedded,...] from [dev]
                pending.append((root, frozenset(requirement.extras)))
                continue
            if key not in seen:
                seen.add(key)
                pending.append((requirement.name, frozenset(requirement.extras)))
            elif requirement.extras:
                pending.append((requirement.name, frozenset(requirement.extras)))
    return seen


def test_constraints_pin_exactly_what_lancetx_dev_installs() -> None:
    pins = _pins()
    needed = _closure("lancetx", {"dev"})
    bootstrap = {"pip", "setuptools", "wheel"}  # a venv's own; pinned when present
    assert sorted(set(pins) - needed - bootstrap) == [], "pinned but never installed (stale)"
    assert sorted(needed - set(pins)) == [], "installed but not pinned"
    wrong = {
        name: (pins[name], importlib.metadata.version(name))
        for name in needed
        if importlib.metadata.version(name) != pins[name]
    }
    assert wrong == {}, "pinned version differs from the installed one"
    assert "pip" in pins and importlib.metadata.version("pip") == pins["pip"]
