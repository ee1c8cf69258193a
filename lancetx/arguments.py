"""Argument checks for the public verbs, read from their own type hints.

A verb called with an argument of the wrong type used to fail deep inside, in
terms of what it was doing with it: ``table.update("id >= 15", {"v": "1"})``
(the arguments swapped) iterated the string's characters and reported columns
``'i'``, ``'d'``, ``' '``. :func:`checked` wraps a function, and
:func:`checked_methods` every public method of a class, so that a call whose
argument does not fit the annotation raises :class:`ArgumentTypeError` naming
the argument, the type it needs, the value it got and the call's signature,
before anything is read or written.

The hints are the signatures' own (one source of truth); a hint the checker does
not understand is not checked. Checks are shallow where that is enough and look
inside mappings and sequences, whose contents users get wrong the most (a ``str``
is refused where a sequence of strings is expected: it would be taken apart
character by character).
"""

from __future__ import annotations

import collections.abc
import functools
import importlib
import inspect
import types
import typing
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, cast

P = ParamSpec("P")
R = TypeVar("R")
C = TypeVar("C", bound=type)

_UNRESOLVED = object()
#: Modules users import functions from by their own name (others: from their package).
_PUBLIC_MODULES = frozenset({"lancetx", "lancetx.aio"})


#: Modules the verbs' hints name that their own modules import for type checkers
#: only (opening a table must not load them: ``tests/test_import_cost.py``). A hint
#: naming one is resolved when it is first checked, by the first call of that verb,
#: which needs the module anyway.
_DEFERRED_MODULES: dict[str, str] = {"pa": "pyarrow"}


class _DeferredNames(dict[str, Any]):
    """The names :data:`_DEFERRED_MODULES` lists, imported on first lookup."""

    def __missing__(self, name: str) -> Any:
        module = _DEFERRED_MODULES.get(name)
        if module is None:
            raise KeyError(name)
        value = self[name] = importlib.import_module(module)
        return value


def _resolve(annotation: object, namespace: dict[str, Any]) -> object:
    """The annotation as a type (annotations are strings under postponed evaluation)."""
    if not isinstance(annotation, str):
        return annotation
    try:
        # the module's own names, as typing does, then the deferred modules
        return eval(annotation, namespace, _DeferredNames())
    except Exception:  # a name only imported for type checkers: not checked
        return _UNRESOLVED


def _is_sequence_of(value: object, item: object) -> bool:
    """A string is refused (it would be taken apart character by character), so is a
    mapping; the items of a collection are checked, an iterator is taken on trust
    (checking would consume it)."""
    if isinstance(value, str | bytes | bytearray | collections.abc.Mapping):
        return False
    if isinstance(value, collections.abc.Collection):
        return all(matches(v, item) for v in value)
    return isinstance(value, collections.abc.Iterable)


def matches(value: object, expected: object) -> bool:
    """Whether ``value`` fits the (resolved) annotation ``expected``."""
    if expected is Any or expected is _UNRESOLVED or isinstance(expected, TypeVar):
        return True
    if expected is None or expected is type(None):
        return value is None
    origin = typing.get_origin(expected)
    args = typing.get_args(expected)
    if origin is typing.Union or origin is types.UnionType:
        return any(matches(value, arg) for arg in args)
    if origin is typing.Literal:
        return value in args
    if origin in (collections.abc.Mapping, collections.abc.MutableMapping, dict):
        if not isinstance(value, collections.abc.Mapping):
            return False
        if len(args) != 2:
            return True
        return all(matches(k, args[0]) and matches(v, args[1]) for k, v in value.items())
    if origin in (collections.abc.Sequence, list):
        return _is_sequence_of(value, args[0] if args else Any)
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(matches(v, args[0]) for v in value)
        return not args or (
            len(args) == len(value) and all(matches(v, a) for v, a in zip(value, args, strict=True))
        )
    if origin in (collections.abc.Iterable, collections.abc.Collection):
        return _is_sequence_of(value, args[0] if args else Any)
    if origin is collections.abc.Callable or expected is collections.abc.Callable:
        return callable(value)
    if origin is not None:
        return isinstance(value, origin) if isinstance(origin, type) else True
    if expected is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(expected, type):
        return isinstance(value, expected)
    return True


def _signature_text(name: str, signature: inspect.Signature) -> str:
    parts: list[str] = []
    star_done = False
    for param in signature.parameters.values():
        if param.name in ("self", "cls"):
            continue
        text = param.name
        if param.kind is param.VAR_POSITIONAL:
            text = "*" + text
            star_done = True
        elif param.kind is param.VAR_KEYWORD:
            text = "**" + text
        elif param.kind is param.KEYWORD_ONLY and not star_done:
            parts.append("*")
            star_done = True
        if param.annotation is not param.empty:
            annotation = param.annotation
            text += f": {annotation if isinstance(annotation, str) else _name(annotation)}"
        if param.default is not param.empty:
            text += f" = {param.default!r}"
        parts.append(text)
    return f"{name}({', '.join(parts)})"


def _name(annotation: object) -> str:
    return getattr(annotation, "__name__", None) or repr(annotation)


def checked(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` with its arguments checked against its annotations on every call."""
    signature = inspect.signature(fn)
    is_method = next(iter(signature.parameters), None) == "self"
    home = fn.__module__
    if home not in _PUBLIC_MODULES:  # lancetx.table.open is lancetx.open to its users
        home = home.rpartition(".")[0] or home
    public = f"{home}.{fn.__name__}"
    resolved: dict[str, object] = {}

    def named(args: tuple[Any, ...]) -> tuple[str, str]:
        # A method is named after the class it was called on (Table.update, not the
        # TableVerbs base that defines it).
        call = f"{type(args[0]).__name__}.{fn.__name__}" if is_method and args else public
        return call, _signature_text(call, signature)

    def hints() -> dict[str, object]:
        if not resolved:
            namespace = dict(getattr(fn, "__globals__", {}))
            for param in signature.parameters.values():
                resolved[param.name] = (
                    _UNRESOLVED
                    if param.annotation is param.empty
                    else _resolve(param.annotation, namespace)
                )
        return resolved

    def swapped(name: str, value: object, bound: inspect.BoundArguments) -> str:
        """A hint when the value fits another argument whose value fits this one."""
        types_ = hints()
        for other, other_value in bound.arguments.items():
            if other in (name, "self") or other not in signature.parameters:
                continue
            if signature.parameters[other].kind in (
                inspect.Parameter.VAR_POSITIONAL,
                inspect.Parameter.VAR_KEYWORD,
            ):
                continue
            if matches(value, types_[other]) and matches(other_value, types_[name]):
                return f" (are {other!r} and {name!r} swapped?)"
        return ""

    def check(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{exc}. Signature: {named(args)[1]}") from None
        types_ = hints()
        for name, value in bound.arguments.items():
            param = signature.parameters[name]
            expected = types_[name]
            if param.kind is param.VAR_KEYWORD:
                continue
            values = value if param.kind is param.VAR_POSITIONAL else (value,)
            for item in values:
                if not matches(item, expected):
                    annotation = param.annotation
                    call, shown = named(args)
                    from lancetx.errors import ArgumentTypeError

                    raise ArgumentTypeError(
                        call,
                        name,
                        annotation if isinstance(annotation, str) else _name(annotation),
                        item,
                        shown,
                        swapped(name, item, bound),
                    )

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def checked_coroutine(*args: Any, **kwargs: Any) -> Any:
            check(args, kwargs)
            return await fn(*args, **kwargs)

        return cast(Callable[P, R], checked_coroutine)

    @functools.wraps(fn)
    def checked_call(*args: P.args, **kwargs: P.kwargs) -> R:
        check(args, kwargs)
        return fn(*args, **kwargs)

    return checked_call


def checked_methods(cls: C) -> C:
    """Wrap every public method defined in ``cls``'s body with :func:`checked`."""
    for name, member in list(vars(cls).items()):
        if name.startswith("_") or not inspect.isfunction(member):
            continue
        setattr(cls, name, checked(member))
    return cls


__all__ = ["checked", "checked_methods", "matches"]
