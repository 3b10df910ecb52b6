"""The Python API: `quantize(...)` → checkpoint directory, `load(path, bits=...)` → model (runtime), `set_bits`,
`slice` → a smaller checkpoint of one width, `evaluate` → scores (evaluation/run.py); exports are
`matgptq.exporters.export` (the subpackage's name is taken, so it is not re-bound here)."""

from __future__ import annotations

from pathlib import Path

from .allocation import EvoConfig, SearchRequest, run_search
from .evaluation.run import evaluate
from .execution import resolve_device
from .exporters import ExportFormat
from .exporters import export as export_checkpoint
from .formats import write_slice
from .formats.checksums import trusted
from .formats.mix import WidthSpec
from .fsutil import check_output
from .models import resolve_model
from .quantization import LayerReport, MethodConfig
from .quantization.options import make_config, parse_bits, settings
from .quantization.run import finished_run, run_quantization, unquantized_tensors


def quantize(
    model: str | Path,
    out: str | Path,
    config: MethodConfig | None = None,
    *,
    calib: str | Path | list[str] | None = None,
    **options,
) -> tuple[Path, list[LayerReport]]:
    """Quantize the HF model `model` (a local directory, or a Hugging Face id `org/name[@revision]` resolved through
    the Hugging Face cache) and write a matgptq checkpoint to `out` (atomically).

    The method and its settings: `config`, a method config (matgptq.GPTQConfig, MatGPTQConfig or RTNConfig, as
    `quantize(model, out, GPTQConfig(bits=4, group_size=64), calib=...)`; a checkpoint's record read back by
    `quantization.config_from_json` makes the same codes again), or instead the short keywords: `method` (gptq, rtn,
    matgptq), `bits` (the width, default 4; for MatGPTQ the target set R, its stored width `master_bits` the widest
    by default) and any field of those configs (`group_size=64`, `act_order=False`, `bit_weights=(1, 1, 4)`, ...),
    None meaning the method's default. Not both: a config with method keywords is a TypeError.
    `bits_config`, with either: each layer's own width (GPTQ/RTN), a {layer: bits} mix or its JSON file
    (formats/mix.py), e.g. a `matgptq search` result, so the mix found on a parent is solved again with every layer a
    dedicated GPTQ run at its width; instead of `bits`.
    `calib`: a UTF-8 text file (cut to `calib_range` by characters) or a list of strings; not needed for RTN;
    `nsamples` windows of `seqlen` tokens drawn with `seed` (quantization/calibration.py, CalibConfig).
    The run (quantization/options.py, RunConfig): `dtype`, the model's dtype while calibrating, and that of the
    unquantized tensors written ("auto": its own, from config.json, except that a bfloat16 or float16 model
    calibrates in float32 on a CPU that emulates that dtype, and GPTQ or MatGPTQ of a float32 model runs its
    calibration passes in bfloat16 on a CPU with bfloat16 arithmetic, from and to float32 weights: quantization/run.py,
    calibration_dtypes; "bfloat16" is what GPTQModel uses on CPU); Hessians and the solver are float32 either way.
    `resume`: continue a killed run from its last finished block (quantization/resume.py); progress is kept beside
    `out` until the checkpoint is written. A run that had finished returns its recorded reports and writes nothing
    (quantization/run.py, finished_run). `device`: auto | cpu | cuda | cuda:i (execution/devices.py). `stream`: read
    each block from the model's files when it is quantized instead of loading the model whole (models/lazy.py);
    None = whenever the files allow it (the result is the same either way), False = load it whole, True = required.
    Finished blocks always go to disk at once (formats/staged.py); `shard_bytes` caps each file of the written
    checkpoint. `overwrite`: replace `out`; `progress`: show progress bars.
    Each keyword sets fields of those configs (quantization/options.py, KEYWORDS); each flag of `matgptq quantize`
    gives one keyword.
    """
    s = settings(config, calib=calib, **options)
    run = s.run
    dev = resolve_device(run.device)
    finished = run.resume and not run.overwrite and Path(out).exists()  # --resume of a run that wrote its checkpoint
    if not finished:
        check_output(out, run.overwrite)
    source = resolve_model(model)  # a directory, or a Hugging Face id through its cache (models/hub.py)
    if finished:  # its reports as recorded; refused as an existing output if made otherwise
        return Path(out), finished_run(out, source, s.method, s.calibration, calib, s.bits_config is not None)
    return run_quantization(
        source,
        out,
        s.method,
        s.calibration,
        calib,
        s.bits_config,
        run.dtype,
        dev,
        resume=run.resume,
        stream=run.stream,
        overwrite=run.overwrite,
        progress=run.progress,
        shard_bytes=run.shard_bytes,
    )


def export(
    src: str | Path,
    out: str | Path,
    format: ExportFormat | str,
    *,
    bits: int | None = None,
    bits_config: WidthSpec | None = None,
    overwrite: bool = False,
    verify: bool = True,
    **gguf_options,
) -> Path:
    """Write the checkpoint `src` at `bits` (or the mix `bits_config`) as `format` (gptq_v1, gptq_v2,
    compressed-tensors, gguf) to `out`, as `matgptq export`; `gguf_options`: qtype, float_type, embed_type.
    `verify`: check a matgptq checkpoint's checksums first (False: a file you trust)."""
    with trusted(not verify):
        return export_checkpoint(
            src, out, format, bits=bits, bits_config=bits_config, overwrite=overwrite, **gguf_options
        )


def search(
    parent: str | Path,
    budgets: str | float | list,
    calib: str | Path,
    out: str | Path,
    *,
    evo: EvoConfig | None = None,
    **options,
) -> list[dict]:
    """Search the best per-layer widths of the MatGPTQ `parent` under each bit budget (e.g. "3.0,2.5" or [3.0, 2.5])
    on the calibration text `calib`, writing `out`/mix-<budget>.json, as `matgptq search`; returns one summary row
    per budget. `evo`: the EvoPress settings (generations, offspring, stages, seed); `options`: those of
    allocation.request.SearchRequest.of (levels, kind, seqlen, sensitivity_tokens, calib_tokens, baselines, reference,
    text, time_limit, ...)."""
    spelled = (
        budgets.split(",") if isinstance(budgets, str) else budgets if isinstance(budgets, (list, tuple)) else [budgets]
    )
    request = SearchRequest.of(
        parent, tuple(str(b).strip() for b in spelled), calib, out, evo=evo or EvoConfig(), **options
    )
    return run_search(request)


def slice(
    parent: str | Path,
    bits: int,
    out: str | Path,
    overwrite: bool = False,  # noqa: A001
    verify: bool = True,
) -> Path:
    """Write the `bits`-bit slice of a parent as its own checkpoint (only that width's data), as `matgptq slice`;
    `verify`: check the parent's checksums first (False: a file you trust)."""
    return write_slice(parent, bits, out, overwrite, verify)


__all__ = ["quantize", "slice", "evaluate", "export", "search", "make_config", "parse_bits", "unquantized_tensors"]
