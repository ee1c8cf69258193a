"""How commands talk: JSON or rich tables on stdout, progress bars and errors on stderr.

Exit codes: 0 ok, 1 findings or a failed operation, 2 usage (click's own).
Progress bars are drawn only when stderr is a terminal and ``--json`` is off.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NoReturn

import typer

OK = 0
FINDINGS = 1
USAGE = 2


def to_jsonable(value: Any) -> Any:
    """Dataclasses, enums, dicts and lists as plain JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
        ok = getattr(type(value), "ok", None)
        if isinstance(ok, property):
            out["ok"] = bool(ok.fget(value)) if ok.fget is not None else False
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_jsonable(v) for v in value]
    return value


def emit_json(command: str, report: Any) -> None:
    """One JSON document on stdout: ``{"command": ..., **report}`` (keys stable)."""
    body = to_jsonable(report)
    document = {"command": command, **(body if isinstance(body, dict) else {"result": body})}
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=True, default=str) + "\n")


def stdout_console() -> Any:
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True)


def stderr_console() -> Any:
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


def parse_storage_options(pairs: list[str] | None) -> dict[str, str]:
    """``["k=v", ...]`` → dict; a pair without ``=`` is a usage error (exit 2)."""
    out: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(
                f"{pair!r} is not KEY=VALUE (e.g. -o aws_region=eu-west-1)",
                param_hint="--storage-option",
            )
        out[key.strip()] = value
    return out


def fail(message: str, *, as_json: bool, command: str, kind: str = "error") -> NoReturn:
    """Report an error and exit 1."""
    if as_json:
        emit_json(command, {"ok": False, "error": {"type": kind, "message": message}})
    else:
        stderr_console().print(f"[bold red]error[/]: {message}", markup=True)
    raise typer.Exit(FINDINGS)


@contextlib.contextmanager
def handled(command: str, as_json: bool) -> Iterator[None]:
    """Turn lancetx errors into exit 1 with the message (JSON or text)."""
    from lancetx.commit.errors import LancetxError

    try:
        yield
    except LancetxError as exc:
        from lancetx.commit.storage.secrets import redact_text

        fail(redact_text(str(exc)), as_json=as_json, command=command, kind=type(exc).__name__)


ProgressFn = Callable[[str, int], None]


@contextlib.contextmanager
def progress(as_json: bool, labels: Mapping[str, str]) -> Iterator[Any]:
    """A progress reporter ``fn(kind, advance)`` (and ``fn.total(kind, n)``): rich
    bars on a terminal, nothing otherwise. ``labels`` names each kind."""
    console = stderr_console()
    if as_json or not console.is_terminal:
        yield _Silent()
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    bars = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
    with bars:
        yield _Bars(bars, labels)


class _Silent:
    def __call__(self, kind: str, advance: int) -> None:
        del kind, advance

    def total(self, kind: str, total: int) -> None:
        del kind, total


class _Bars:
    def __init__(self, bars: Any, labels: Mapping[str, str]) -> None:
        self._bars = bars
        self._labels = labels
        self._tasks: dict[str, Any] = {}

    def _task(self, kind: str) -> Any:
        if kind not in self._tasks:
            self._tasks[kind] = self._bars.add_task(self._labels.get(kind, kind), total=None)
        return self._tasks[kind]

    def __call__(self, kind: str, advance: int) -> None:
        self._bars.advance(self._task(kind), advance)

    def total(self, kind: str, total: int) -> None:
        self._bars.update(self._task(kind), total=total)


def table(title: str, columns: list[str], rows: list[list[Any]]) -> Any:
    """A rich table whose cells fold instead of being cut (keys must stay copyable)."""
    from rich.table import Table

    out = Table(title=title, title_justify="left")
    for column in columns:
        out.add_column(column, overflow="fold")
    for row in rows:
        out.add_row(*("" if v is None else str(v) for v in row))
    return out


def print_findings(console: Any, findings: list[Any], *, title: str = "Findings") -> None:
    """Findings as paragraphs (long paths and commands stay whole and copyable)."""
    if not findings:
        console.print("[green]no problems found[/]")
        return
    from rich.markup import escape

    console.print(f"[bold]{title}[/] ({len(findings)})")
    for f in findings:
        where = f" version {f.version}" if f.version is not None else ""
        colour = "red" if f.severity == "error" else "yellow"
        console.print(f"[{colour}]{f.severity.upper()}[/] {f.kind}{where}: {escape(f.detail)}")
        console.print(f"  fix: {f.fix}", markup=False)
