"""What `matgptq.quantize` does around the block loop (pipeline.py): calibration windows, opening the model (streamed
block by block when its files allow), per-layer widths of a mix, resume state, the staged output and the metadata
every checkpoint records, and the torchrun split (only rank 0 writes)."""

from __future__ import annotations

import json
import platform
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import NamedTuple

import torch
import transformers

from .._version import __version__
from ..errors import UserError
from ..execution import DTYPES, compute_dtype, dist_backend, init_from_env, native_bfloat16, world
from ..formats.mix import WidthSpec, read_mix
from ..formats.staged import StagedCheckpoint
from ..fsutil import check_output, scratch_sibling
from ..models import (
    ModelSource,
    arch_spec,
    calibration_windows,
    config_dtype,
    file_sha256,
    get_blocks,
    load_fp_model,
    load_tokenizer,
    quantized_layer_names,
    read_text,
    require_model_dir,
    tokenize,
    weight_keys,
)
from ..models.lazy import LazyModel
from ..untrusted import read_json
from .calibration import CalibConfig
from .config import Method, MethodConfig
from .layer import LayerReport
from .pipeline import batch_tokens_on, quantize_model
from .resume import BlockState, resume_dir

EXPERT_POLICY = "an expert with n < K routed tokens (K: input width) gets H = (n·H_own + (K − n)·H_mean) / K"


def unquantized_tensors(model, layers: dict, outside: str | None = None) -> dict[str, torch.Tensor]:
    """The tensors a checkpoint stores as they are: all but the quantized weights and tied duplicates (lm_head);
    with `outside` (the blocks' path), only those outside the blocks (the blocks' own went to their files)."""
    quantized = weight_keys(set(layers), arch_spec(model)) if layers else set()  # --skip's layers stay tensors
    tensors, seen = {}, set()
    for name, t in model.state_dict().items():
        if (outside is not None and name.startswith(f"{outside}.")) or name in quantized or t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        tensors[name] = t
    return tensors


def _windows(tokenizer, calib, cfg: MethodConfig, calib_cfg: CalibConfig) -> torch.Tensor:
    """The calibration windows: `nsamples` random windows of `seqlen` tokens of the text (none for RTN)."""
    if calib is None:
        if cfg.method is not Method.RTN:
            raise UserError(f"--method {cfg.method.value} needs calibration text; pass --calib FILE")
        return torch.zeros(1, 1, dtype=torch.int64)  # RTN never runs the model
    text = calib if isinstance(calib, list) else read_text(calib, calib_cfg.text_range)
    return calibration_windows(tokenize(tokenizer, text), calib_cfg.nsamples, calib_cfg.seqlen, calib_cfg.seed)


class Dtypes(NamedTuple):
    """The dtypes of one quantization; None: the model's own (config.json)."""

    load: torch.dtype | None  # the model's weights while quantized, what the solver starts from
    passes: torch.dtype | None  # the calibration passes', where not `load` (narrow.py)
    stored: torch.dtype | None  # the unquantized tensors written; None: as loaded


def calibration_dtypes(model: Path, dtype: str, dev: torch.device, method: Method) -> Dtypes:
    """The dtypes `--dtype dtype` quantizes the model at `model` in. An explicit dtype is all three. `auto`:
    - a bfloat16 or float16 model on a CPU without arithmetic in it (execution.compute_dtype) is loaded and
      calibrated in float32 and written in its own dtype: half values, held exactly in float32, round back exactly;
    - GPTQ or MatGPTQ of a float32 model on a CPU with bfloat16 arithmetic (execution.native_bfloat16) calibrates
      in bfloat16, from the float32 weights, and writes float32 (narrow.py): a tie in quality, in less CPU time
      (docs/guide/quantize.md#defaults, --dtype; docs/decisions/matgptq-defaults.md for the parent);
    - otherwise the model's own, throughout."""
    chosen = DTYPES[dtype]
    if chosen is not None:
        return Dtypes(chosen, None, chosen)
    stored = config_dtype(model)
    compute = compute_dtype(dtype, stored, dev)
    if compute is not None:
        return Dtypes(compute, None, getattr(torch, stored))
    if (
        method in (Method.GPTQ, Method.MATGPTQ)
        and stored in (None, "float32")
        and dev.type == "cpu"
        and native_bfloat16(dev)
    ):
        return Dtypes(None, torch.bfloat16, None)
    return Dtypes(None, None, None)


def _open(model: Path, dtype: torch.dtype | None, stream: bool | None):
    """(LazyModel or None, the model in `dtype`, None: its own): streamed from its files when they allow it, unless
    `stream` is False."""
    lazy = LazyModel.open(model, dtype) if stream is not False else None
    if stream and lazy is None:
        raise UserError(
            f"the safetensors files in {model} do not name the model's parameters as transformers does; "
            "they cannot be streamed: pass stream=None (stream when possible) or False"
        )
    return lazy, lazy.model if lazy is not None else load_fp_model(model, dtype)


def _with_widths(cfg: MethodConfig, fp, bits_config: WidthSpec | None) -> MethodConfig:
    """`cfg` with each layer's width from the mix `bits_config` (names as in a parent: --skip's layers stay out)."""
    names = [n for n in quantized_layer_names(fp, arch_spec(fp)) if not cfg.skips(n)]
    if not names:
        raise UserError(f"--skip {' '.join(cfg.skip)} matches every quantizable layer; nothing would be quantized")
    if bits_config is None:
        return cfg
    widths = read_mix(bits_config, names)
    return cfg.with_mix(widths)


def _metadata(
    cfg: MethodConfig,
    calib_cfg: CalibConfig,
    calib,
    source: ModelSource,
    fp,
    passes: torch.dtype,
    reports: list[LayerReport],
    dev: torch.device,
    size: int,
) -> dict:
    """matgptq.json's record of how the checkpoint was made (docs/formats.md §1.4)."""
    meta = {
        "quantization": cfg.to_json(),
        "calibration": {
            **asdict(calib_cfg),
            "text_range": list(calib_cfg.text_range),
            "dtype": str(passes).removeprefix("torch."),
            "sha256": file_sha256(calib) if isinstance(calib, (str, Path)) else None,
        },
        "source_model": source.spec,  # `org/name@commit` for a Hugging Face id, else the absolute path
        "model_type": fp.config.model_type,
        "versions": {
            "matgptq": __version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
            # float summation order, part of bit-exactness: thread count and the CPU's vector unit
            "torch_threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        },
        "report": [{k: v for k, v in asdict(r).items() if v is not None} for r in reports],
    }
    routed = [r for r in reports if r.tokens is not None]
    if routed:  # fused experts: the low-token policy (quantization/experts.py) and the experts it hit
        meta["experts"] = {"policy": EXPERT_POLICY, "starved": {r.name: r.tokens for r in routed if r.starved}}
    if dev.type != "cpu":
        meta["device"] = torch.cuda.get_device_name(dev) if dev.type == "cuda" else str(dev)
    if size > 1:
        meta["distributed"] = {"world_size": size, "backend": dist_backend()}
    return meta


def run_quantization(
    source: ModelSource,
    out: str | Path,
    cfg: MethodConfig,
    calib_cfg: CalibConfig,
    calib,
    bits_config: WidthSpec | None,
    dtype: str,
    dev: torch.device,
    *,
    resume: bool,
    stream: bool | None,
    overwrite: bool,
    progress: bool,
    shard_bytes: int,
) -> tuple[Path, list[LayerReport]]:
    """Quantize the model at `source` with `cfg` and write the checkpoint `out` (the API's arguments, checked)."""
    model = require_model_dir(source.path)
    windows = _windows(load_tokenizer(model), calib, cfg, calib_cfg)
    init_from_env(dev)  # under torchrun: one process of several (execution/distributed.py)
    rank, size = world()
    if size > 1 and resume:
        raise UserError("--resume is for single-process runs; run the resumed quantization without torchrun")
    dtypes = calibration_dtypes(model, dtype, dev, cfg.method)
    lazy, fp = _open(model, dtypes.load, stream)
    cfg = _with_widths(cfg, fp, bits_config)
    passes = dtypes.passes or fp.dtype
    settings = _run_settings(model, cfg, calib_cfg, calib, windows, dtype, dev)
    settings["compute_dtype"] = str(passes)  # `auto` depends on the CPU (calibration_dtypes)
    state = BlockState(out, settings, resume) if size == 1 else None
    # finished blocks: in the resume directory, else a private sibling of `out` (created by the first block written)
    scratch = scratch_sibling(Path(out).resolve())
    stored = dtypes.stored
    stage = StagedCheckpoint(state.dir if state is not None else scratch, stored) if rank == 0 else _Discard()
    try:
        _, reports, _ = quantize_model(
            fp,
            windows,
            cfg,
            progress=progress,
            state=state,
            device=dev,
            source=lazy,
            sink=stage,
            passes_dtype=dtypes.passes,
        )
        if rank > 0:  # every rank holds the result; one writes it
            return Path(out), reports
        meta = _metadata(cfg, calib_cfg, calib, source, fp, passes, reports, dev, size)
        _assemble(stage, out, fp, cfg, reports, stored, meta, model, overwrite, shard_bytes)
    finally:
        if state is None and rank == 0:
            shutil.rmtree(stage.dir, ignore_errors=True)
    if state is not None:
        state.finish()
    return Path(out), reports


def _assemble(stage, out, fp, cfg: MethodConfig, reports, stored, meta: dict, model: Path, overwrite, shard_bytes):
    """The staged blocks and the model's unquantized tensors written as the checkpoint `out`, its config saying the
    dtype the tensors are stored in (not the one calibrated in)."""
    spec = arch_spec(fp)
    config = fp.config.to_dict()
    if stored is not None:
        config.update({k: str(stored).removeprefix("torch.") for k in ("dtype", "torch_dtype") if k in config})
    stage.assemble(
        out,
        len(get_blocks(fp, spec)),
        config,
        unquantized_tensors(fp, {}, spec.blocks),
        {r.name: list(r.shape) for r in reports},
        {r.name: cfg.width_of(r.name) for r in reports},
        meta,
        model,
        overwrite,
        shard_bytes,
    )


def finished_run(
    out: str | Path, source: ModelSource, cfg: MethodConfig, calib_cfg: CalibConfig, calib, mixed: bool
) -> list[LayerReport]:
    """`quantize --resume` where `out` exists: a run that finished (its checkpoint renamed into place, its resume
    state deleted, or left by a kill between the two: deleted now); its layers' reports as recorded. `out` must be a
    checkpoint of `source` made with `cfg` (its per-layer widths not compared when `mixed`) and this calibration
    (its text by hash); anything else is refused as any existing output is (fsutil.check_output)."""
    ours, reports = _recorded_settings(cfg.to_json(), calib_cfg, calib, source, mixed), None
    try:
        meta = read_json(Path(out) / "matgptq.json")
        theirs = _recorded_settings(meta["quantization"], meta["calibration"], None, meta["source_model"], mixed)
        reports = [LayerReport.from_json(r) for r in meta["report"]]
    except (UserError, KeyError, TypeError, ValueError, AttributeError):
        theirs = None
    if theirs != ours or reports is None:
        check_output(out, overwrite=False)  # it exists: refused
        raise UserError(f"{out} was removed while it was read; run again")
    shutil.rmtree(resume_dir(out), ignore_errors=True)
    return reports


def _recorded_settings(quantization: dict, calibration, calib, source, mixed: bool) -> dict:
    """What finished_run compares, from this run's arguments or from a checkpoint's matgptq.json."""
    if isinstance(calibration, CalibConfig):
        sha = file_sha256(calib) if isinstance(calib, (str, Path)) else None
        calibration = {**asdict(calibration), "text_range": list(calibration.text_range), "sha256": sha}
    keep = ("text_range", "nsamples", "seqlen", "seed", "sha256")
    return json.loads(
        json.dumps(
            {
                "quantization": {k: v for k, v in quantization.items() if not (mixed and k == "layer_bits")},
                "calibration": {k: calibration[k] for k in keep},
                "source_model": source if isinstance(source, str) else source.spec,
            }
        )
    )


class _Discard:
    """The sink of ranks > 0 under torchrun: rank 0 writes the finished blocks."""

    def write_block(self, *args) -> None:
        pass

    def read_layers(self, *args) -> dict:
        return {}


def _run_settings(
    model, cfg: MethodConfig, calib_cfg: CalibConfig, calib, windows: torch.Tensor, dtype: str, device: torch.device
) -> dict:
    """What a quantization's result depends on, for refusing to resume another run's state: the model (its path,
    config and weight files' sizes and times — hashing a large model's shards would take long), the options, the
    calibration text (its hash, or the windows' when given as strings), the dtype and the kind of device (float
    summation order, as does the forward batch: a state saved at another batch size also holds other batches).
    Streaming or not changes nothing (tested), so it is not recorded."""
    files = sorted(Path(model).glob("*.safetensors"))
    return {
        "model": str(Path(model).resolve()),
        "config": (Path(model) / "config.json").read_text(),
        "weights": [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files],
        "quantization": cfg.to_json(),
        "calibration": {**asdict(calib_cfg), "text_range": list(calib_cfg.text_range)},
        "calib_sha256": file_sha256(calib) if isinstance(calib, (str, Path)) else None,
        "windows": [list(windows.shape), int(windows.sum())],
        "dtype": dtype,
        "device": device.type,
        "batch_tokens": batch_tokens_on(device),
    }
