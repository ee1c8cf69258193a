"""The sans-IO kit (``commit/sansio.py``): one place resumes steps, and each driver
says which errors go back into its steps."""

from __future__ import annotations

import ast
import asyncio
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from lancetx.commit.errors import LancetxError, TransientObjectStoreError
from lancetx.commit.sansio import Outcome, drive, drive_async, relay

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("commit", "externalstore", "lancetx", "pyspark_lancetx")


def _throw_calls() -> list[str]:
    found = []
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "throw"
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_only_the_kit_resumes_steps_with_an_error() -> None:
    # A driver written by hand again (its own send/throw loop) would pick its own
    # errors to pass: every driver is a table of effects on the kit instead.
    calls = _throw_calls()
    assert len(calls) == 1 and calls[0].startswith("commit/sansio.py:"), calls


def _steps(seen: list[BaseException]) -> Generator[str, Any, str]:
    try:
        yield "first"
    except BaseException as exc:  # records what reached it
        seen.append(exc)
        raise
    return "done"


def _failing(error: BaseException) -> Any:
    def perform(effect: str) -> Any:
        raise error

    return perform


@pytest.mark.parametrize(
    "error", [TransientObjectStoreError("GetObject", "k", "503"), KeyboardInterrupt()]
)
def test_a_driver_passing_every_error_throws_an_interrupt_into_the_steps(
    error: BaseException,
) -> None:
    seen: list[BaseException] = []
    with pytest.raises(type(error)):
        drive(_steps(seen), _failing(error), passes=BaseException)
    assert seen == [error]


def test_a_driver_passing_lancetx_errors_lets_an_interrupt_leave_the_steps_untouched() -> None:
    seen: list[BaseException] = []
    with pytest.raises(KeyboardInterrupt):
        drive(_steps(seen), _failing(KeyboardInterrupt()), passes=LancetxError)
    assert not [e for e in seen if not isinstance(e, GeneratorExit)]


def test_the_async_driver_passes_the_same_errors() -> None:
    seen: list[BaseException] = []

    async def perform(effect: str) -> Any:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(drive_async(_steps(seen), perform, passes=BaseException))
    assert len(seen) == 1 and isinstance(seen[0], asyncio.CancelledError)


def test_results_an_outcome_and_a_relay() -> None:
    def steps() -> Generator[int, Any, list[Any]]:
        got = [(yield 1)]
        try:
            yield 2
        except LancetxError as exc:
            got.append(str(exc))
        return got

    relayed: list[int] = []

    def perform(effect: int) -> Any:
        return "one" if effect == 1 else Outcome(error=LancetxError("two failed"))

    def note(effect: int) -> int:
        relayed.append(effect)
        return effect

    result = drive(relay(steps(), note, passes=LancetxError), perform, passes=LancetxError)
    assert result == ["one", "two failed"] and relayed == [1, 2]
