"""Spark's pushed-down filters as Lance SQL filter expressions.

Spark (with ``spark.sql.python.filterPushdown.enabled``) offers a conjunction
of simple filters; each one this module can express exactly becomes a Lance
filter the scanner applies, the rest stay with Spark. Translations keep SQL's
three-valued logic (a NULL comparison filters the row out on both sides).

Literals translated: int, float (finite), bool, str, date. Others (timestamps,
decimals, binaries, arrays) are left to Spark: their Lance literal forms depend
on time zones and precision rules that differ from Spark's.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence
from typing import Any

_COMPARISONS = {
    "EqualTo": "=",
    "EqualNullSafe": "=",
    "GreaterThan": ">",
    "GreaterThanOrEqual": ">=",
    "LessThan": "<",
    "LessThanOrEqual": "<=",
}


class _Untranslatable(Exception):
    pass


def column(path: Sequence[str]) -> str:
    """A column reference: every segment back-quoted (names may hold spaces or dots)."""
    if not path:
        raise _Untranslatable
    return ".".join("`" + part.replace("`", "``") + "`" for part in path)


def literal(value: Any) -> str:
    """A Lance SQL literal for ``value``; raises _Untranslatable for other types."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Untranslatable
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        return f"date '{value.isoformat()}'"
    raise _Untranslatable


def _translate(f: Any, negated: bool = False) -> str:
    kind = type(f).__name__
    if kind == "EqualNullSafe" and negated:
        # NOT (a <=> 1) keeps rows where a is NULL; NOT (a = 1) does not.
        raise _Untranslatable
    if kind in _COMPARISONS:
        if f.value is None:  # col = NULL is never true; let Spark decide what it meant
            raise _Untranslatable
        return f"{column(f.attribute)} {_COMPARISONS[kind]} {literal(f.value)}"
    if kind == "In":
        values = [v for v in f.value if v is not None]
        if not values or len(values) != len(f.value):
            raise _Untranslatable
        return f"{column(f.attribute)} IN ({', '.join(literal(v) for v in values)})"
    if kind == "IsNull":
        return f"{column(f.attribute)} IS NULL"
    if kind == "IsNotNull":
        return f"{column(f.attribute)} IS NOT NULL"
    if kind == "Not":
        return f"NOT ({_translate(f.child, not negated)})"
    if kind == "StringStartsWith":
        return f"starts_with({column(f.attribute)}, {literal(f.value)})"
    if kind == "StringEndsWith":
        return f"ends_with({column(f.attribute)}, {literal(f.value)})"
    if kind == "StringContains":
        return f"strpos({column(f.attribute)}, {literal(f.value)}) > 0"
    raise _Untranslatable


def translate(f: Any) -> str | None:
    """The Lance filter for one Spark ``Filter``, or None if it cannot be expressed exactly."""
    try:
        return _translate(f)
    except _Untranslatable:
        return None


def conjunction(parts: Sequence[str]) -> str | None:
    """``(a) AND (b) …``; None for no parts."""
    return " AND ".join(f"({p})" for p in parts) if parts else None
