"""What every command shares: other libraries kept quiet while it runs, warnings and errors as one line, progress
bars closed before a message, and what an interrupted command leaves behind."""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..allocation.request import state_path
from ..integrations.transformers import IMPORT_LOGGERS
from ..models import quiet_loggers
from ..quantization.resume import resume_dir


def quiet_transformers() -> None:
    """Our own progress bars and one-line errors only: transformers' warnings and loading bars go to stderr."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


@contextmanager
def third_party_quiet() -> Iterator[None]:
    """While a command runs, other libraries' deprecation and usage warnings are not shown (matgptq's own are), unless
    the user asked for warnings (-W, PYTHONWARNINGS), and the loggers of the backends transformers imports (torchao,
    torch's pytree: IMPORT_LOGGERS) log errors only; all as before afterwards."""
    format_warning = warnings.formatwarning
    with warnings.catch_warnings(), quiet_loggers(*IMPORT_LOGGERS):
        warnings.formatwarning = one_line_warning
        if not sys.warnoptions:
            for category in (DeprecationWarning, FutureWarning, UserWarning):
                warnings.filterwarnings("ignore", category=category, module=r"(?!matgptq(\.|$))")
        try:
            yield
        finally:
            warnings.formatwarning = format_warning


def one_line_warning(message, category, filename, lineno, line=None) -> str:
    """A warning as the command's own line (`matgptq: warning: ...`), not Python's file:line and source excerpt."""
    return f"matgptq: warning: {message}\n"


def end_progress_bars() -> None:
    """Close the progress bars still on screen, each ending its line, so that a message starts on a line of its own."""
    from tqdm import tqdm

    for bar in list(getattr(tqdm, "_instances", ())):
        bar.leave = True  # a closed bar that is not left would only return to the start of its line
        bar.close()


def left_behind(a: argparse.Namespace) -> str:
    """What an interrupted command leaves: the resume state of quantize or search, else nothing (outputs are written
    atomically)."""
    states: list[Path] = []
    if a.command == "quantize":
        states = [resume_dir(a.out)]
    elif a.command == "search":
        states = [state_path(Path(a.out), b.strip()) for b in a.budget.split(",")]
    states = [p for p in states if p.exists()]
    if not states:
        return "nothing was written"
    again = "the same command again" if a.resume else "the same command with --resume"
    return f"the progress is kept in {', '.join(map(str, states))}; run {again} to continue"
