"""Values typed on the command line: one parser for ``prune --arg``, ``prune --amount`` and ``oneshot -o``.

A value is read as the Python literal it spells (``3``, ``0.5``, ``1e-3``,
``inf``, ``True``, ``None``, ``(0, 1)``, ``'quoted'``), and as plain text when
it spells none (``fro``, ``2:4``). A number, alone or inside a literal, must be
written in decimal with the digits 0-9: Python also reads ``1_0`` as ten,
``0x10`` as sixteen and ``٣`` as three, and on a command line each is far
likelier a typo (or a look-alike) than meant, so it is refused rather than guessed.
"""

from __future__ import annotations

import ast
import re
from typing import Any

import click

_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:inf|infinity|nan)", re.IGNORECASE)
"""A number as the command line writes it: decimal, digits 0-9, no ``_``."""


def parse_value(text: str) -> Any:
    """``text`` as the number or Python literal it spells, else as itself; ValueError for a number not in decimal."""
    stripped = text.strip()
    if _DECIMAL.fullmatch(stripped):
        try:
            return int(stripped)
        except ValueError:
            return float(stripped)
    if _python_reads_a_number(stripped):
        raise ValueError(_not_decimal(text))
    try:
        value = ast.literal_eval(stripped)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return text
    for written in _numbers_written(stripped):
        if not _DECIMAL.fullmatch(written):
            raise ValueError(_not_decimal(written))
    return value


def _python_reads_a_number(text: str) -> bool:
    for number in (int, float):
        try:
            number(text)
        except ValueError:
            continue
        return True
    return False


def _numbers_written(source: str) -> list[str]:
    """How each int or float inside the literal ``source`` is written (``0x10``, ``1_0``, ``2``)."""
    numbers = []
    for node in ast.walk(ast.parse(source, mode="eval")):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            numbers.append(ast.get_source_segment(source, node) or "")
    return numbers


def _not_decimal(written: str) -> str:
    if "_" in written:
        return f"{written!r} is not a number here: write it without '_'"
    return f"{written!r} is not a number here: write it in decimal, with the digits 0-9"


def parse_option_value(text: str, param_hint: str) -> Any:
    """:func:`parse_value` for one option's value; a bad one is a usage error naming ``param_hint``."""
    try:
        return parse_value(text)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint=param_hint) from None


def key_values(ctx: click.Context, param: click.Parameter, items: tuple[str, ...]) -> dict[str, Any]:
    """A click callback: repeated ``KEY=VALUE`` items as a dict, each value read by :func:`parse_value`."""
    parsed: dict[str, Any] = {}
    for item in items:
        key, equals, text = item.partition("=")
        if not equals or not key.isidentifier():
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", ctx, param)
        if key in parsed:
            raise click.BadParameter(f"{key!r} is given twice", ctx, param)
        try:
            parsed[key] = parse_value(text)
        except ValueError as error:
            raise click.BadParameter(f"{key}: {error}", ctx, param) from None
    return parsed


class Number(click.ParamType):
    """A click type for an int or float option, read by :func:`parse_value`: at least ``minimum``, below ``below``.

    A number not written in decimal (``1_0``, ``0x1``) is refused, and so is NaN wherever a bound is given.
    """

    def __init__(
        self, kind: type[int] | type[float], minimum: int | None = None, *, below: float | None = None
    ) -> None:
        self.kind = kind
        self.minimum = minimum
        self.below = below
        self.name = kind.__name__

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str):
            try:
                value = parse_value(value)
            except ValueError as error:
                self.fail(str(error), param, ctx)
        if isinstance(value, bool) or not isinstance(value, int if self.kind is int else (int, float)):
            self.fail(f"{value!r} is not a valid {'integer' if self.kind is int else 'float'}", param, ctx)  # click's
        number = self.kind(value)
        if self.minimum is not None and not number >= self.minimum:  # NaN fails every comparison: refused too
            self.fail(f"{number!r} is below the least value, {self.minimum}", param, ctx)
        if self.below is not None and not number < self.below:
            self.fail(f"{number!r} is not below {self.below!r}", param, ctx)
        return number
