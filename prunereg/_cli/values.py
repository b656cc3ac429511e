"""Values typed on the command line: one parser for ``prune --arg``, ``prune --amount`` and ``oneshot -o``.

A value is read as the Python literal it spells (``3``, ``0.5``, ``1e-3``,
``inf``, ``True``, ``None``, ``(0, 1)``, ``'quoted'``), and as plain text when
it spells none (``fro``, ``2:4``). Python also reads ``1_0`` as ten; on a
command line that is far likelier a typo, so a number written with ``_`` is
refused rather than guessed.
"""

from __future__ import annotations

import ast
from typing import Any

import click


def parse_value(text: str) -> Any:
    """``text`` as the number or Python literal it spells, else as itself; ValueError for ``_`` in a number."""
    for number in (int, float):
        try:
            value = number(text)
        except ValueError:
            continue
        if "_" in text:
            raise ValueError(f"{text!r} is not a number here: write it without '_'")
        return value
    try:
        return ast.literal_eval(text.strip())
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return text


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
