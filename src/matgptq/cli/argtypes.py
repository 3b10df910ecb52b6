"""Argument types and shared options of the command line (`matgptq` and its subcommands' parsers)."""

from __future__ import annotations

import argparse


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """--help ends each option's text with its default, unless the text shows it already (%(default)): not for flags,
    nor for options whose default is None or an empty list (nothing given; their text says what happens then)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "%(default)" in text or not action.option_strings or action.nargs == 0:
            return text
        if default is None or default is argparse.SUPPRESS or default == []:
            return text
        return f"{text} (default: %(default)s)"


def fraction_range(text: str) -> tuple[float, float]:
    try:
        a, b = (float(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected START:END fractions like 0.6:1, got {text!r}") from None
    return a, b


def floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers like 1,1,1, got {text!r}") from None


def ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 3,4,8, got {text!r}") from None


def device_help(what: str) -> str:
    """--device's help: where `what` happens, and the choices."""
    from ..execution import CHOICES_HELP

    return f"where {what}: {CHOICES_HELP}"


def add_device_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--device", default="auto", help=device_help(what))


def add_verify_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-verify",
        action="store_true",
        help="do not check a matgptq checkpoint's tensors against the checksums it records (a file "
        "you trust; saves one pass over its data)",
    )
