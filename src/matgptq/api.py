"""The Python API: `quantize(...)` → checkpoint directory, `load(path, bits=...)` → model (runtime), `set_bits`,
`slice` → a smaller checkpoint of one width, `evaluate` → scores (evaluation/run.py); exports are
`matgptq.export.export` (the subpackage's name is taken, so it is not re-bound here)."""

from __future__ import annotations

import os
import platform
import shutil
import uuid
from dataclasses import asdict, replace
from pathlib import Path

import torch
import transformers

from ._version import __version__
from .execution import resolve_device
from .errors import UserError
from .evaluation.run import evaluate
from .formats import write_slice
from .formats.mix import WidthSpec, read_mix, width_spec
from .formats.staged import SHARD_BYTES, StagedCheckpoint
from .fsutil import check_output
from .models import (
    arch_spec, calibration_windows, file_sha256, get_blocks, load_fp_model, load_tokenizer, quantized_layer_names,
    read_text, require_model_dir, resolve_model, tokenize,
)  # fmt: skip
from .models.lazy import LazyModel
from .quantization import CalibConfig, LayerReport, Method, QuantConfig, quantize_model
from .execution import dist_backend, init_from_env, world
from .quantization.resume import BlockState


COMPUTE_DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_bits(bits: int | str | tuple[int, ...] | list[int]) -> tuple[int, ...]:
    if isinstance(bits, int):
        return (bits,)
    if isinstance(bits, str):
        return tuple(int(b) for b in bits.split(",") if b.strip())
    return tuple(int(b) for b in bits)


def make_config(method: str | Method = "gptq", bits=4, master_bits: int | None = None,
                bit_weights: tuple[float, ...] | None = None, **options) -> QuantConfig:  # fmt: skip
    """QuantConfig from user-level arguments: `bits` is one width, or the target set R for MatGPTQ."""
    method = Method(method)
    widths = parse_bits(bits)
    if method is Method.MATGPTQ:
        master = master_bits or max(widths)
        return QuantConfig(method=method, bits=master, target_bits=widths, bit_weights=tuple(bit_weights or ()), **options)
    if len(widths) != 1:
        raise UserError(f"--method {method.value} takes one width, got {list(widths)}; use --method matgptq for several")
    return QuantConfig(method=method, bits=widths[0], **options)


def unquantized_tensors(model, layers: dict, outside: str | None = None) -> dict[str, torch.Tensor]:
    """The tensors a checkpoint stores as they are: all but the quantized weights and tied duplicates (lm_head);
    with `outside` (the blocks' path), only those outside the blocks (the blocks' own went to their files)."""
    quantized = {f"{n}.weight" for n in layers}  # layers left out by --skip stay ordinary tensors
    tensors, seen = {}, set()
    for name, t in model.state_dict().items():
        if (outside is not None and name.startswith(f"{outside}.")) or name in quantized or t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        tensors[name] = t
    return tensors


def quantize(
    model: str | Path, out: str | Path, *, calib: str | Path | list[str] | None = None, method: str = "gptq",
    bits=None, bits_config: WidthSpec | None = None, master_bits: int | None = None, bit_weights=None,
    calib_range: tuple[float, float] = (0.0, 1.0),
    nsamples: int = 128, seqlen: int = 256, seed: int = 0, overwrite: bool = False, progress: bool = True,
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
    config.json; "bfloat16" is what GPTQModel uses on CPU). Hessians and the solver are float32 either way.
    `resume`: continue a killed run from its last finished block (quantization/resume.py); progress is kept beside
    `out` until the checkpoint is written.
    `device`: auto | cpu | cuda | cuda:i (execution/devices.py). `stream`: read each block from the model's files when it is
    quantized instead of loading the model whole (models/lazy.py); None = whenever the files allow it (the result is
    the same either way), False = load it whole, True = required. Finished blocks always go to disk at once
    (formats/staged.py); `shard_bytes` caps each file of the written checkpoint.
    """
    if dtype not in COMPUTE_DTYPES:
        raise UserError(f"--dtype {dtype} is not one of {', '.join(COMPUTE_DTYPES)}")
    if shard_bytes < 1:
        raise UserError(f"--shard-size must be positive, got {shard_bytes} bytes")
    dev = resolve_device(device)
    width_spec(bits, bits_config)  # one of them
    cfg = make_config(method, 4 if bits is None else bits, master_bits, bit_weights, **options)
    calib_cfg = CalibConfig(
        path=str(calib) if isinstance(calib, (str, Path)) else None, text_range=tuple(calib_range),
        nsamples=nsamples, seqlen=seqlen, seed=seed,
    )  # fmt: skip
    check_output(out, overwrite)
    source = resolve_model(model)  # a directory, or a Hugging Face id through its cache (models/hub.py)
    model = require_model_dir(source.path)
    tokenizer = load_tokenizer(model)
    if calib is None:
        if cfg.method is not Method.RTN:
            raise UserError(f"--method {cfg.method.value} needs calibration text; pass --calib FILE")
        windows = torch.zeros(1, 1, dtype=torch.int64)  # RTN never runs the model
    else:
        text = calib if isinstance(calib, list) else read_text(calib, calib_cfg.text_range)
        windows = calibration_windows(tokenize(tokenizer, text), nsamples, seqlen, seed)
    init_from_env(dev)  # under torchrun: one process of several (execution/distributed.py)
    rank, size = world()
    if size > 1 and resume:
        raise UserError("--resume is for single-process runs; run the resumed quantization without torchrun")
    lazy = LazyModel.open(model, COMPUTE_DTYPES[dtype]) if stream is not False else None
    if stream and lazy is None:
        raise UserError(f"the safetensors files in {model} do not name the model's parameters as transformers does; "
                        "they cannot be streamed: pass stream=None (stream when possible) or False")  # fmt: skip
    fp = lazy.model if lazy is not None else load_fp_model(model, COMPUTE_DTYPES[dtype])
    names = [n for n in quantized_layer_names(fp, arch_spec(fp.config.model_type)) if not cfg.skips(n)]
    if not names:
        raise UserError(f"--skip {' '.join(cfg.skip)} matches every quantizable layer; nothing would be quantized")
    if bits_config is not None:  # names as in a parent: --skip's layers stay out
        widths = read_mix(bits_config, names)
        widest = max(widths.values())
        cfg = replace(cfg, bits=widest, target_bits=(widest,), layer_bits=tuple(widths.items()))
    settings = _run_settings(model, cfg, calib_cfg, calib, windows, dtype, dev)
    state = BlockState(out, settings, resume) if size == 1 else None
    # finished blocks: in the resume directory, else a private sibling of `out` (created by the first block written)
    scratch = Path(out).resolve().parent / f".{Path(out).name}.blocks-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    stage = StagedCheckpoint(state.dir if state is not None else scratch) if rank == 0 else _Discard()
    try:
        _, reports, _ = quantize_model(fp, windows, cfg, progress=progress, state=state, device=dev, source=lazy,
                                       sink=stage)  # fmt: skip
        if rank > 0:  # every rank holds the result; one writes it
            return Path(out), reports
        spec = arch_spec(fp.config.model_type)
        tensors = unquantized_tensors(fp, {}, outside=spec.blocks)
        meta = {
            "quantization": cfg.to_json(),
            "calibration": {**asdict(calib_cfg), "text_range": list(calib_cfg.text_range),
                            "dtype": str(fp.dtype).removeprefix("torch."),
                            "sha256": file_sha256(calib) if isinstance(calib, (str, Path)) else None},
            "source_model": source.spec,  # `org/name@commit` for a Hugging Face id, else the absolute path
            "model_type": fp.config.model_type,
            "versions": {"matgptq": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
                         "python": platform.python_version(),
                         # float summation order, part of bit-exactness: thread count and the CPU's vector unit
                         "torch_threads": torch.get_num_threads(),
                         "cpu_capability": torch.backends.cpu.get_cpu_capability()},
            "report": [asdict(r) for r in reports],
        }  # fmt: skip
        if dev.type != "cpu":
            meta["device"] = torch.cuda.get_device_name(dev) if dev.type == "cuda" else str(dev)
        if size > 1:
            meta["distributed"] = {"world_size": size, "backend": dist_backend()}
        stage.assemble(out, len(get_blocks(fp, spec)), fp.config.to_dict(), tensors,
                       {r.name: list(r.shape) for r in reports}, {r.name: cfg.width_of(r.name) for r in reports}, meta,
                       model, overwrite, shard_bytes)  # fmt: skip
    finally:
        if state is None and rank == 0:
            shutil.rmtree(stage.dir, ignore_errors=True)
    if state is not None:
        state.finish()
    return Path(out), reports


class _Discard:
    """The sink of ranks > 0 under torchrun: rank 0 writes the finished blocks."""

    def write_block(self, *args) -> None:
        pass

    def read_layers(self, *args) -> dict:
        return {}


def _run_settings(model, cfg: QuantConfig, calib_cfg: CalibConfig, calib, windows: torch.Tensor, dtype: str,
                  device: torch.device) -> dict:  # fmt: skip
    """What a quantization's result depends on, for refusing to resume another run's state: the model (its path,
    config and weight files' sizes and times — hashing a large model's shards would take long), the options, the
    calibration text (its hash, or the windows' when given as strings), the dtype and the kind of device (float
    summation order). Streaming or not changes nothing (tested), so it is not recorded."""
    files = sorted(Path(model).glob("*.safetensors"))
    return {"model": str(Path(model).resolve()), "config": (Path(model) / "config.json").read_text(),
            "weights": [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files],
            "quantization": cfg.to_json(), "calibration": {**asdict(calib_cfg), "text_range": list(calib_cfg.text_range)},
            "calib_sha256": file_sha256(calib) if isinstance(calib, (str, Path)) else None,
            "windows": [list(windows.shape), int(windows.sum())], "dtype": dtype, "device": device.type}  # fmt: skip


def slice(parent: str | Path, bits: int, out: str | Path, overwrite: bool = False) -> Path:  # noqa: A001 — the API name
    """Write the `bits`-bit slice of a parent as its own checkpoint (only that width's data), as `matgptq slice`."""
    return write_slice(parent, bits, out, overwrite)


__all__ = ["quantize", "slice", "evaluate", "make_config", "parse_bits"]
