"""`evaluate`: perplexity (and KL to a reference) on text windows and/or zero-shot accuracy through lm-eval, for a
model or several widths of one parent, loaded once; the report `matgptq eval --json` writes."""

from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from ..execution import DTYPES, compute_dtype, resolve_device
from ..formats.mix import WidthSpec
from ..models import config_dtype, eval_windows, load_tokenizer, read_text, resolve_model, tokenize
from ..runtime import load, set_bits
from .perplexity import Teacher, score
from .tasks import check_answers_fit, require_lm_eval, resolve_tasks, score_tasks, with_average, wrap_model

EVAL_TOKENS_PER_PASS = 2048  # default batch: this many tokens of windows per forward pass (2048 // seqlen)


def _check(text, tasks, kl_to, limit, task_batch_size, batch_size, dtype) -> None:
    if dtype not in DTYPES:
        raise UserError(f"--dtype {dtype} is not one of {', '.join(DTYPES)}")
    if not text and not tasks:
        raise UserError("nothing to evaluate; give --text FILE (perplexity) and/or --tasks NAMES (zero-shot accuracy)")
    if kl_to and not text:
        raise UserError("--kl-to compares next-token distributions on text; give --text FILE too")
    for flag, value in (("--limit", limit), ("--task-batch-size", task_batch_size), ("--batch-size", batch_size)):
        if value is not None and value < 1:
            raise UserError(f"{flag} must be at least 1, got {value}")


def bits_label(model, bits) -> str:
    """How a row names the widths it scored: "fp", "4", or "mix 3.50 avg"."""
    state = getattr(model, "matgptq", None)
    if state is None:
        return "fp" if bits is None else str(bits)
    widths = list(state.bits.values())
    if len(set(widths)) == 1:
        return str(widths[0])
    return f"mix {sum(widths) / len(widths):.2f} avg"


def evaluate(
    model: str | Path,
    *,
    bits: WidthSpec | list[WidthSpec] | None = None,
    text: str | Path | None = None,
    text_range: tuple[float, float] = (0.0, 1.0),
    seqlen: int = 256,
    max_tokens: int | None = None,
    kl_to: str | Path | None = None,
    tasks: str | None = None,
    tasks_dir: str | Path | None = None,
    limit: int | None = None,
    batch_size: int | None = None,
    task_batch_size: int = 16,
    device: str = "auto",
    dtype: str = "auto",
    progress: bool = True,
    verify: bool = True,
) -> dict:
    """Score `model` (a directory or Hugging Face id: unquantized, a matgptq parent/slice, a GPTQ or a
    compressed-tensors checkpoint) at each width of `bits` (one width spec or a list: formats/mix.py; None = as
    stored). Returns the report:
    `results` (perplexity rows, with `kl` when `kl_to` names the reference) and/or `task_results` (lm-eval).
    `dtype` (execution.DTYPES): what both models compute in; auto: each its own, except that a bfloat16 or float16
    model on a CPU without arithmetic in it computes in float32 (execution.compute_dtype), several times faster.
    `verify`: check a matgptq checkpoint's checksums (False: a file you trust)."""
    _check(text, tasks, kl_to, limit, task_batch_size, batch_size, dtype)
    dev = resolve_device(device)
    specs = resolve_tasks(tasks, tasks_dir) if tasks else []  # every file checked before any model is loaded
    if specs:
        require_lm_eval()
    source = resolve_model(model)
    tokenizer = load_tokenizer(source.path)
    windows = eval_windows(tokenize(tokenizer, read_text(text, text_range)), seqlen, max_tokens) if text else None
    batch = batch_size or max(1, EVAL_TOKENS_PER_PASS // seqlen)
    reference = _load(kl_to, None, dtype, dev, verify) if kl_to else None
    teacher = Teacher(reference, windows, batch, progress=progress) if reference is not None else None
    del reference  # the teacher keeps what it needs
    widths = bits if isinstance(bits, list) else [bits]
    loaded = _load(source.path, widths[0], dtype, dev, verify)
    lm = wrap_model(loaded, tokenizer, task_batch_size) if specs else None
    if lm is not None:
        check_answers_fit(specs, lm.tok_encode, lm.max_length, limit)
    results, task_results = [], []
    for spec in widths:
        if spec is not None:
            set_bits(loaded, spec)
        label = bits_label(loaded, spec)
        if windows is not None:
            sc = score(loaded, windows, teacher, batch, progress=progress)
            row = {"model": str(model), "bits": label, "tokens": int(windows.numel()), "ppl": sc.ppl}
            results.append(row | ({"kl": sc.kl} if teacher is not None else {}))
        if specs:
            scores = with_average(score_tasks(lm, specs, limit))
            task_results += [{"model": str(model), "bits": label, "task": t, **s} for t, s in scores.items()]
    report: dict = {"model": str(model), "dtype": str(next(loaded.parameters()).dtype).removeprefix("torch.")}
    if results:
        report.update({"text": str(text), "text_range": list(text_range), "seqlen": seqlen, "results": results})
    if task_results:
        report.update({"tasks": {s.name: str(s.path) for s in specs}, "limit": limit, "task_results": task_results})
    return report


def _load(model: str | Path, bits: WidthSpec | None, dtype: str, dev, verify: bool):
    """`model` (a directory or Hugging Face id) loaded dense on `dev` in the dtype `--dtype dtype` gives it there."""
    path = resolve_model(model).path
    dtype = compute_dtype(dtype, config_dtype(path), dev)
    return load(path, bits=bits, dtype=dtype, packed=False, verify=verify).to(dev)
