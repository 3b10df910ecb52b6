"""The Python API: `quantize(...)` → checkpoint directory, `load(path, bits=...)` → model (runtime), `set_bits`,
`slice` → a smaller checkpoint of one width, `evaluate` → scores (evaluation/run.py); exports are
`matgptq.exporters.export` (the subpackage's name is taken, so it is not re-bound here)."""

from __future__ import annotations

from pathlib import Path

from .allocation import EvoConfig, SearchRequest, run_search
from .errors import UserError
from .evaluation.run import evaluate
from .execution import DTYPES, resolve_device
from .exporters import ExportFormat
from .exporters import export as export_checkpoint
from .formats import write_slice
from .formats.checksums import trusted
from .formats.mix import WidthSpec, width_spec
from .formats.staged import SHARD_BYTES
from .fsutil import check_output
from .models import resolve_model
from .quantization import CalibConfig, LayerReport, Method, MethodConfig, config_for, method_of
from .quantization.run import finished_run, run_quantization, unquantized_tensors


def parse_bits(bits: int | str | tuple[int, ...] | list[int]) -> tuple[int, ...]:
    if isinstance(bits, int):
        return (bits,)
    if isinstance(bits, str):
        return tuple(int(b) for b in bits.split(",") if b.strip())
    return tuple(int(b) for b in bits)


def make_config(method: str | Method = "gptq", bits=4, master_bits: int | None = None,
                bit_weights: tuple[float, ...] | None = None, **options) -> MethodConfig:  # fmt: skip
    """The method's typed config (quantization/config.py) from user-level arguments: `bits` is one width, or the
    target set R for MatGPTQ (its master width `master_bits`, default the widest); `options` as `quantize`'s."""
    method = method_of(method)
    widths = parse_bits(bits)
    if method is Method.MATGPTQ:
        master = master_bits or max(widths)
        return config_for(method, bits=master, target_bits=widths, bit_weights=tuple(bit_weights or ()), **options)
    if len(widths) != 1:
        raise UserError(f"--method {method.value} takes one width, got {list(widths)}; use --method matgptq for several")
    return config_for(method, bits=widths[0], **options)


def quantize(
    model: str | Path, out: str | Path, *, calib: str | Path | list[str] | None = None, method: str = "gptq",
    bits=None, bits_config: WidthSpec | None = None, master_bits: int | None = None, bit_weights=None,
    calib_range: tuple[float, float] = (0.0, 1.0),
    nsamples: int = CalibConfig.nsamples, seqlen: int = CalibConfig.seqlen, seed: int = 0, overwrite: bool = False, progress: bool = True,
    dtype: str = "auto", resume: bool = False, device: str = "auto", stream: bool | None = None,
    shard_bytes: int = SHARD_BYTES, **options,
) -> tuple[Path, list[LayerReport]]:  # fmt: skip
    """Quantize the HF model `model` (a local directory, or a Hugging Face id `org/name[@revision]` resolved through
    the Hugging Face cache) and write a matgptq checkpoint to `out` (atomically).

    `bits`: the width (default 4), for MatGPTQ the target set. `bits_config` instead (GPTQ/RTN): each layer's own
    width, a {layer: bits} mix or its JSON file (formats/mix.py), e.g. a `matgptq search` result, so the mix found on
    a parent is solved again with every layer a dedicated GPTQ run at its width.
    `calib`: a UTF-8 text file (cut to `calib_range` by characters) or a list of strings; not needed for RTN.
    `dtype`: the model's dtype while calibrating, and that of the unquantized tensors written ("auto": its own, from
    config.json, except that a bfloat16 or float16 model calibrates in float32 on a CPU that emulates that dtype,
    and GPTQ of a float32 model runs its calibration passes in bfloat16 on a CPU with bfloat16 arithmetic, from and
    to float32 weights: quantization/run.py, calibration_dtypes; "bfloat16" is what GPTQModel uses on CPU).
    Hessians and the solver are float32 either way.
    `resume`: continue a killed run from its last finished block (quantization/resume.py); progress is kept beside
    `out` until the checkpoint is written. A run that had finished returns its recorded reports and writes nothing
    (quantization/run.py, finished_run).
    `device`: auto | cpu | cuda | cuda:i (execution/devices.py). `stream`: read each block from the model's files
    when it is
    quantized instead of loading the model whole (models/lazy.py); None = whenever the files allow it (the result is
    the same either way), False = load it whole, True = required. Finished blocks always go to disk at once
    (formats/staged.py); `shard_bytes` caps each file of the written checkpoint.
    """
    if dtype not in DTYPES:
        raise UserError(f"--dtype {dtype} is not one of {', '.join(DTYPES)}")
    if shard_bytes < 1:
        raise UserError(f"--shard-size must be positive, got {shard_bytes} bytes")
    dev = resolve_device(device)
    width_spec(bits, bits_config)  # one of them
    cfg = make_config(method, 4 if bits is None else bits, master_bits, bit_weights, **options)
    calib_cfg = CalibConfig(
        path=str(calib) if isinstance(calib, (str, Path)) else None, text_range=tuple(calib_range),
        nsamples=nsamples, seqlen=seqlen, seed=seed,
    )  # fmt: skip
    finished = resume and not overwrite and Path(out).exists()  # --resume of a run that wrote its checkpoint
    if not finished:
        check_output(out, overwrite)
    source = resolve_model(model)  # a directory, or a Hugging Face id through its cache (models/hub.py)
    if finished:  # its reports as recorded; refused as an existing output if made otherwise
        return Path(out), finished_run(out, source, cfg, calib_cfg, calib, bits_config is not None)
    return run_quantization(source, out, cfg, calib_cfg, calib, bits_config, dtype, dev, resume=resume, stream=stream,
                            overwrite=overwrite, progress=progress, shard_bytes=shard_bytes)


def export(src: str | Path, out: str | Path, format: ExportFormat | str, *, bits: int | None = None,
           bits_config: WidthSpec | None = None, overwrite: bool = False, verify: bool = True,
           **gguf_options) -> Path:  # fmt: skip
    """Write the checkpoint `src` at `bits` (or the mix `bits_config`) as `format` (gptq_v1, gptq_v2,
    compressed-tensors, gguf) to `out`, as `matgptq export`; `gguf_options`: qtype, float_type, embed_type.
    `verify`: check a matgptq checkpoint's checksums first (False: a file you trust)."""
    with trusted(not verify):
        return export_checkpoint(src, out, format, bits=bits, bits_config=bits_config, overwrite=overwrite,
                                 **gguf_options)  # fmt: skip


def search(parent: str | Path, budgets: str | float | list, calib: str | Path, out: str | Path, *,
           evo: EvoConfig | None = None, **options) -> list[dict]:  # fmt: skip
    """Search the best per-layer widths of the MatGPTQ `parent` under each bit budget (e.g. "3.0,2.5" or [3.0, 2.5])
    on the calibration text `calib`, writing `out`/mix-<budget>.json, as `matgptq search`; returns one summary row
    per budget. `evo`: the EvoPress settings (generations, offspring, stages, seed); `options`: the fields of
    allocation.request.SearchRequest (levels, kind, seqlen, sensitivity_tokens, calib_tokens, reference, text, ...)."""
    spelled = budgets.split(",") if isinstance(budgets, str) else budgets if isinstance(budgets, (list, tuple)) \
        else [budgets]  # fmt: skip
    request = SearchRequest(parent=Path(parent), budgets=tuple(str(b).strip() for b in spelled), calib=Path(calib),
                            out=Path(out), evo=evo or EvoConfig(), **options)  # fmt: skip
    return run_search(request)


def slice(parent: str | Path, bits: int, out: str | Path, overwrite: bool = False,  # noqa: A001
          verify: bool = True) -> Path:  # fmt: skip
    """Write the `bits`-bit slice of a parent as its own checkpoint (only that width's data), as `matgptq slice`;
    `verify`: check the parent's checksums first (False: a file you trust)."""
    return write_slice(parent, bits, out, overwrite, verify)


__all__ = ["quantize", "slice", "evaluate", "export", "search", "make_config", "parse_bits", "unquantized_tensors"]
