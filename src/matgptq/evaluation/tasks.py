"""Zero-shot multiple-choice accuracy through lm-eval (EleutherAI's harness), on local JSONL files, offline.

A task name maps to `<tasks dir>/<name>.jsonl`; each line is one question in one of two shapes:
    {"query": str, "choices": [str, ...], "gold": int}                  ARC, PIQA, OpenBookQA, ...
    {"context_options": [str, ...], "continuation": str, "gold": int}   Winogrande-style
The file is checked here (one-line errors naming file:line), then scored by lm-eval from a task config built from the
templates shipped in `task_templates/` (package data) with the file as a local `json` dataset. The model is the object
`matgptq.load` returns, wrapped once in lm-eval's HFLM, so `set_bits` switches widths between scorings in memory.
Needs the `tasks` extra: pip install 'matgptq[tasks]'.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import UserError

TASKS_DIR_ENV = "MATGPTQ_TASKS_DIR"  # where the task files are when --tasks-dir is not given
SHAPES = {  # template name → the keys of one line
    "choices": ("query", "choices", "gold"),
    "context_options": ("context_options", "continuation", "gold"),
}
METRICS = ("acc", "acc_norm")


@dataclass(frozen=True)
class TaskSpec:
    name: str
    path: Path
    shape: str  # a key of SHAPES
    size: int  # questions in the file


def default_tasks_dir() -> Path:
    """$MATGPTQ_TASKS_DIR; without it there is no default (the files are the user's, not the package's)."""
    if not os.environ.get(TASKS_DIR_ENV):
        raise UserError(
            f"no tasks directory: pass --tasks-dir DIR or set {TASKS_DIR_ENV} (a folder of "
            "<task>.jsonl files, docs/guide/evaluation.md)"
        )
    return Path(os.environ[TASKS_DIR_ENV])


def _line_shape(path: Path, lineno: int, line: str) -> str:
    where = f"{path}:{lineno}"
    try:
        doc = json.loads(line)
    except json.JSONDecodeError as e:
        raise UserError(f"{where} is not valid JSON ({e.msg}); each line must be one JSON object") from None
    shape = next((s for s, keys in SHAPES.items() if isinstance(doc, dict) and set(keys) <= set(doc)), None)
    if shape is None:
        got = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
        raise UserError(f"{where} has keys {got}; expected query/choices/gold or context_options/continuation/gold")
    options = doc["choices" if shape == "choices" else "context_options"]
    text = doc["query" if shape == "choices" else "continuation"]
    if (
        not isinstance(text, str)
        or not isinstance(options, list)
        or len(options) < 2
        or not all(isinstance(o, str) for o in options)
    ):
        raise UserError(f"{where}: expected a string and a list of at least two strings ({', '.join(SHAPES[shape])})")
    gold = doc["gold"]
    if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(options):
        raise UserError(f"{where}: gold {gold!r} is not an index of its {len(options)} options (0..{len(options) - 1})")
    return shape


def read_task_file(path: Path) -> tuple[str, int]:
    """(shape, number of questions) of a task file, every line checked."""
    shapes, n = set(), 0
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                raise UserError(f"{path}:{lineno} is empty; remove blank lines (one JSON object per line)")
            shapes.add(_line_shape(path, lineno, line))
            n += 1
    if n == 0:
        raise UserError(f"{path} has no questions; give a JSONL file with one question per line")
    if len(shapes) > 1:
        raise UserError(f"{path} mixes the query/choices and context_options shapes; use one shape per file")
    return shapes.pop(), n


def resolve_tasks(names: str | list[str], tasks_dir: str | Path | None = None) -> list[TaskSpec]:
    """Check every named task file before any model is loaded."""
    d = Path(tasks_dir) if tasks_dir is not None else default_tasks_dir()
    if not d.is_dir():
        raise UserError(f"tasks directory {d} not found; pass --tasks-dir DIR (a folder of <task>.jsonl files)")
    names = [n.strip() for n in (names.split(",") if isinstance(names, str) else names) if n.strip()]
    if not names:
        raise UserError("--tasks names no task; give comma-separated names like arc_easy,piqa")
    specs = []
    for name in names:
        path = d / f"{name}.jsonl"
        if not path.is_file():
            have = ", ".join(sorted(p.stem for p in d.glob("*.jsonl"))) or "none"
            raise UserError(f"unknown task {name!r}: no {path} (tasks in {d}: {have})")
        shape, size = read_task_file(path)
        specs.append(TaskSpec(name, path.resolve(), shape, size))
    return specs


def task_config(spec: TaskSpec) -> dict:
    """The lm-eval task config (a dict, as lm-eval reads from YAML) for one local task file."""
    import yaml

    text = resources.files(__package__).joinpath("task_templates", f"{spec.shape}.yaml").read_text(encoding="utf-8")
    return {"task": spec.name, "dataset_kwargs": {"data_files": {"test": str(spec.path)}}, **yaml.safe_load(text)}


def _scored_pairs(doc: dict, shape: str, delimiter: str) -> Iterator[tuple[str, str]]:
    """(context, continuation) of each option of one question, as the templates make lm-eval score it."""
    if shape == "choices":
        return ((doc["query"], delimiter + c) for c in doc["choices"])
    return ((c, delimiter + doc["continuation"]) for c in doc["context_options"])


def continuation_tokens(context: str, continuation: str, encode: Callable[[str], list]) -> int:
    """Tokens lm-eval scores for `continuation` after `context` (TemplateLM._encode_pair): the context's trailing
    whitespace moves to the continuation, whose tokens are those of the whole text past the context's own; after an
    empty context, the continuation's own."""
    if not context:
        return len(encode(continuation))
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    return len(encode(context + continuation)) - len(encode(context))


def check_answers_fit(
    specs: list[TaskSpec], encode: Callable[[str], list], max_length: int, limit: int | None = None
) -> None:
    """Refuse, before anything is scored, a question (of the first `limit`) whose scored text is longer than the
    model's context: lm-eval cannot score it and stops on a bare assertion. `encode` and `max_length` are the HFLM's
    own (`tok_encode`, `max_length`), so the count is the one lm-eval asserts on."""
    for spec in specs:
        delimiter = task_config(spec)["target_delimiter"]
        with spec.path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(itertools.islice(f, limit), 1):
                pairs = _scored_pairs(json.loads(line), spec.shape, delimiter)
                longest = max(continuation_tokens(c, t, encode) for c, t in pairs)
                if longest > max_length:
                    cut = f" or --limit {lineno - 1}" if lineno > 1 else ""
                    raise UserError(
                        f"{spec.path}:{lineno}: an answer of {longest} tokens does not fit the model's "
                        f"{max_length}-token context, so lm-eval cannot score it; leave {spec.name} out of "
                        f"--tasks{cut}"
                    )


def require_lm_eval():
    """lm-eval, imported offline (no hub access: the data are local files, the model an object or a directory)."""
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager  # noqa: F401
    except ImportError as e:
        raise UserError(f"zero-shot tasks need lm-eval ({e}); pip install 'matgptq[tasks]'") from None
    logging.getLogger("lm_eval").setLevel(logging.ERROR)  # its notes on passing a model object, --limit, …
    return lm_eval


def wrap_model(model, tokenizer, batch_size: int = 16):
    """lm-eval's HFLM around a loaded model object (no copy: widths set later by `set_bits` are what it scores)."""
    require_lm_eval()
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, device=str(model.device))


def run_lm_eval(lm, specs: list[TaskSpec], limit: int | None = None) -> dict:
    """lm-eval's `simple_evaluate` on the tasks; `lm` is an HFLM or a model name ("hf") — the same configs either way.
    Returns lm-eval's own results dict."""
    lm_eval = require_lm_eval()
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(
        model=lm,
        tasks=[task_config(s) for s in specs],
        task_manager=TaskManager(include_defaults=False),
        limit=limit,
        bootstrap_iters=0,
        log_samples=False,
    )


def accuracies(results: dict, specs: list[TaskSpec]) -> dict[str, dict]:
    """{task: {"n": questions scored, "acc": …, "acc_norm": …}} from lm-eval's results."""
    out = {}
    for s in specs:
        r = results["results"][s.name]
        acc = float(r["acc,none"])
        # context_options: every option scores the same continuation, so normalising by its length changes nothing
        acc_norm = acc if s.shape == "context_options" else float(r["acc_norm,none"])
        out[s.name] = {"n": int(results["n-samples"][s.name]["effective"]), "acc": acc, "acc_norm": acc_norm}
    return out


def score_tasks(lm, specs: list[TaskSpec], limit: int | None = None) -> dict[str, dict]:
    return accuracies(run_lm_eval(lm, specs, limit), specs)


def with_average(scores: dict[str, dict]) -> dict[str, dict]:
    """The scores plus an "average" entry: the unweighted mean over tasks (as papers average zero-shot tasks)."""
    avg = {"n": sum(s["n"] for s in scores.values())}
    avg.update({m: sum(s[m] for s in scores.values()) / len(scores) for m in METRICS})
    return {**scores, "average": avg}
