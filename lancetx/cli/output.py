"""How commands talk: JSON or tables on stdout, progress bars and errors on stderr.

Exit codes: 0 ok, 1 findings or a failed operation, 2 usage: click's own, and
every error that says the command line itself is wrong (a bad URI or storage
option, a version or table that does not exist).

On a terminal, tables are rich tables. Piped (stdout not a terminal), a table is
one aligned line per row at full width, so keys and commands are never broken
and ``grep``/``cut`` see one finding per line. Object names and every other
string that comes from a table or a user are printed as text, never as rich
markup (a key ``data/[/bold]x`` must neither crash nor restyle the output).

Progress bars are drawn on stderr only when stdout and stderr are terminals and
``--json`` is off, and only once a command has walked more than a few dozen
versions or objects.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NoReturn

import typer

OK = 0
FINDINGS = 1
USAGE = 2
#: Ctrl-C (128 + SIGINT), as shells report it.
INTERRUPTED = 130

#: A walk draws a progress bar once it has seen more than this many versions or objects
#: (environment variable ``LANCETX_PROGRESS_AFTER`` overrides it).
PROGRESS_AFTER = 40


def _progress_after() -> int:
    try:
        return int(os.environ.get("LANCETX_PROGRESS_AFTER", PROGRESS_AFTER))
    except ValueError:
        return PROGRESS_AFTER


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


def fail(
    message: str, *, as_json: bool, command: str, kind: str = "error", code: int = FINDINGS
) -> NoReturn:
    """Report an error and exit ``code`` (1; 2 for a usage error)."""
    if as_json:
        emit_json(command, {"ok": False, "error": {"type": kind, "message": message}})
    else:
        from rich.markup import escape

        label = "usage error" if code == USAGE else "error"
        stderr_console().print(f"[bold red]{label}[/]: {escape(printable(message))}")
    raise typer.Exit(code)


def usage_error(message: str, *, as_json: bool, command: str) -> NoReturn:
    """A usage error found while running (exit 2), reported like :func:`fail`."""
    fail(message, as_json=as_json, command=command, kind="UsageError", code=USAGE)


def _usage_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean the command line is wrong, not the table."""
    from lancetx.commit.errors import (
        DatasetNotFoundError,
        InvalidUriError,
        StorageOptionError,
        VersionNotFoundError,
    )
    from lancetx.errors import NotAnExternalStoreTableError
    from lancetx.externalstore.errors import InvalidConfigError

    return (
        DatasetNotFoundError,
        InvalidUriError,
        StorageOptionError,
        VersionNotFoundError,
        InvalidConfigError,
        NotAnExternalStoreTableError,
    )


@contextlib.contextmanager
def handled(command: str, as_json: bool) -> Iterator[None]:
    """Turn lancetx errors into their message and exit 1 (2 for a usage error); Ctrl-C
    into a line that says the command stopped part-way, and exit 130."""
    from lancetx.commit.errors import LancetxError

    try:
        yield
    except KeyboardInterrupt:
        # Without this typer exits 130 without a word, and the operator cannot tell a
        # finished run from one cut short.
        fail(
            f"interrupted (Ctrl-C): {command} stopped part-way; what it finished stays "
            f"done. Run the same {command} command again to finish (lancetx-sync verify "
            "URI shows where the table stands).",
            as_json=as_json,
            command=command,
            kind="Interrupted",
            code=INTERRUPTED,
        )
    except LancetxError as exc:
        from lancetx.commit.storage.secrets import redact_text

        code = USAGE if isinstance(exc, _usage_errors()) else FINDINGS
        message = redact_text(str(exc))
        fail(message, as_json=as_json, command=command, kind=type(exc).__name__, code=code)


ProgressFn = Callable[[str, int], None]


@contextlib.contextmanager
def progress(as_json: bool, labels: Mapping[str, str]) -> Iterator[Any]:
    """A progress reporter ``fn(kind, advance)`` (and ``fn.total(kind, n)``): rich
    bars on a terminal once the walk is longer than :data:`PROGRESS_AFTER` items,
    nothing otherwise. ``labels`` names each kind."""
    console = stderr_console()
    if as_json or not console.is_terminal or not stdout_console().is_terminal:
        # Piped output (``| cat``, ``> file``) is read later, not watched.
        yield _Silent()
        return
    bars = _Bars(console, labels)
    try:
        yield bars
    finally:
        bars.stop()


class _Silent:
    def __call__(self, kind: str, advance: int) -> None:
        del kind, advance

    def total(self, kind: str, total: int) -> None:
        del kind, total


class _Bars:
    """Counts from the start (callers are threads of a pool); draws from the moment the
    walk is long enough to be worth a bar, with the counts so far."""

    def __init__(self, console: Any, labels: Mapping[str, str]) -> None:
        self._console = console
        self._labels = labels
        self._after = _progress_after()
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._totals: dict[str, int] = {}
        self._bars: Any = None
        self._tasks: dict[str, Any] = {}

    def _start_if_long(self) -> None:
        if self._bars is not None:
            return
        walked = max([*self._counts.values(), *self._totals.values(), 0])
        if walked <= self._after:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self._bars = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self._console,
            transient=False,
        )
        self._bars.start()
        for kind in self._counts.keys() | self._totals.keys():
            self._task(kind)

    def _task(self, kind: str) -> Any:
        if kind not in self._tasks:
            self._tasks[kind] = self._bars.add_task(
                self._labels.get(kind, kind),
                total=self._totals.get(kind),
                completed=self._counts.get(kind, 0),
            )
        return self._tasks[kind]

    def __call__(self, kind: str, advance: int) -> None:
        with self._lock:
            self._counts[kind] = self._counts.get(kind, 0) + advance
            if self._bars is None:
                self._start_if_long()
            elif kind in self._tasks:
                self._bars.advance(self._tasks[kind], advance)
            else:
                self._task(kind)

    def total(self, kind: str, total: int) -> None:
        with self._lock:
            self._totals[kind] = total
            if self._bars is None:
                self._start_if_long()
            else:
                self._bars.update(self._task(kind), total=total)

    def stop(self) -> None:
        with self._lock:
            if self._bars is not None:
                self._bars.stop()


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on rather than show (escape
    sequences, bidirectional overrides, other control and format characters) written
    as ``\\xNN`` / ``\\uNNNN``: an object name cannot restyle, hide or reorder output."""
    if text.isprintable():
        return text
    return "".join(
        ch
        if ch.isprintable()
        else (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")
        for ch in text
    )


def _cell(value: Any) -> str:
    return "" if value is None else printable(str(value))


def print_table(
    console: Any,
    title: str | None,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    header: bool = True,
) -> None:
    """A table: on a terminal a rich table whose cells fold instead of being cut;
    piped, the title then one aligned line per row, never wrapped (keys stay whole
    and copyable). Cells are text, never markup."""
    cells = [[_cell(v) for v in row] for row in rows]
    if not console.is_terminal:
        lines = ([list(columns)] if header else []) + cells
        widths = [max((len(line[i]) for line in lines), default=0) for i in range(len(columns))]
        out = [printable(title)] if title else []
        for line in lines:
            out.append("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip())
        console.file.write("".join(f"{text}\n" for text in out))
        console.file.flush()
        return
    from rich.table import Table
    from rich.text import Text

    out_table = Table(
        title=Text(printable(title)) if title else None, title_justify="left", show_header=header
    )
    for column in columns:
        out_table.add_column(Text(column), overflow="fold")
    for row in cells:
        out_table.add_row(*(Text(v) for v in row))
    console.print(out_table)


def print_findings(console: Any, findings: list[Any], *, title: str = "Findings") -> None:
    """Findings, one per line with its fix on the next (long paths and commands stay
    whole and copyable)."""
    if not findings:
        console.print("[green]no problems found[/]")
        return
    from rich.markup import escape

    console.print(f"[bold]{escape(printable(title))}[/] ({len(findings)})")
    for f in findings:
        where = f" version {f.version}" if f.version is not None else ""
        colour = "red" if f.severity == "error" else "yellow"
        severity, kind, detail = (
            escape(printable(v)) for v in (f.severity.upper(), f.kind, f.detail)
        )
        console.print(f"[{colour}]{severity}[/] {kind}{where}: {detail}")
        console.print(f"  fix: {printable(f.fix)}", markup=False)


def say(console: Any, text: str) -> None:
    """A line of plain text (object names, errors, messages): never read as markup,
    control characters shown, not acted on."""
    console.print(printable(text), markup=False)
