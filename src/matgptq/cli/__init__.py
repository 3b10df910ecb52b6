"""The `matgptq` command line: quantize, eval, slice, export, search, verify. User errors print one line and exit with status 2."""

from __future__ import annotations

import argparse
import sys
import tempfile

from ..errors import UserError
from ..fsutil import out_of_space
from . import evaluate, export, quantize, search, verify
from . import slice as slice_command
from .session import end_progress_bars, left_behind, quiet_transformers, third_party_quiet

# each command's module: add_parser(subparsers) and run(args), which parses nothing more, calls the API and prints
COMMANDS = {
    "quantize": quantize,
    "eval": evaluate,
    "slice": slice_command,
    "export": export,
    "search": search,
    "verify": verify,
}


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
        except Exception as e:  # a write no writer of ours names (a temporary file): still one line
            if not out_of_space(e):
                raise
            end_progress_bars()
            print(
                f"matgptq: error: no space left on the device ({str(e).splitlines()[0][:200]}); free space (also "
                f"in {tempfile.gettempdir()}, where temporary files go) and run again; {left_behind(args)}",
                file=sys.stderr,
            )
            return 2
    return 0
