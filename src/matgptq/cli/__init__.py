"""The `matgptq` command line: quantize, eval, slice, export, search. User errors print one line and exit with status 2."""

from __future__ import annotations

import argparse
import sys

from ..errors import UserError
from . import evaluate, export, quantize, search
from . import slice as slice_command
from .session import end_progress_bars, left_behind, quiet_transformers, third_party_quiet

# each command's module: add_parser(subparsers) and run(args), which parses nothing more, calls the API and prints
COMMANDS = {"quantize": quantize, "eval": evaluate, "slice": slice_command, "export": export, "search": search}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="matgptq", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS.values():
        command.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    with third_party_quiet():
        args = build_parser().parse_args(argv)
        quiet_transformers()
        try:
            COMMANDS[args.command].run(args)
        except UserError as e:
            end_progress_bars()
            print(f"matgptq: error: {e}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            end_progress_bars()
            print(f"matgptq: interrupted; {left_behind(args)}", file=sys.stderr)
            return 130
    return 0
