"""Helpers of tests/formats/test_compressed_tensors_reader*.py: synthetic stories260K sources (random codes, no
calibration: fast, every code and zero point occurs), their compressed-tensors exports, and compressed-tensors' own
reading of a file (the oracle: its target matching and its decompressor, never ours)."""

import json
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file

import matgptq
from matgptq.exporters.compressed_tensors import export_compressed_tensors
from matgptq.formats.parent import save_checkpoint
from tests.conftest import STORIES
from tests.exporters.gptq_helpers import _layer

PROJ = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
LAYERS = [f"model.layers.{i}.{m}" for i in range(5) for m in PROJ]  # stories260K: down_proj has K = 172
MIX = {n: (2, 3, 4, 5, 6, 7, 8)[i % 7] for i, n in enumerate(LAYERS)}  # every width: 7 config groups

SOURCES = {  # name: (symmetric, master width per layer (int: all), group size)
    "sym8-g32": (True, 8, 32),  # K = 172 at group 32: the export repeats scales at group 4 (ragged)
    "sym6-channel": (True, 6, -1),
    "asym3-g32": (False, 3, 32),
    "asym8-g32": (False, 8, 32),
    "asym4-channel": (False, 4, -1),
    "asym-mix-g32": (False, MIX, 32),  # a GPTQ/RTN-style checkpoint of mixed widths (shift 0)
}
EXPORTS = {  # id: (source, bits); None = the stored widths
    **{f"sym-{b}bit": ("sym8-g32", b) for b in range(2, 9)},
    "sym-mix": ("sym8-g32", "MIX"),
    "sym-channel-5bit": ("sym6-channel", 5),
    "asym-3bit": ("asym3-g32", 3),
    "asym-8bit": ("asym8-g32", 8),
    "asym-channel-4bit": ("asym4-channel", 4),
    "asym-mix": ("asym-mix-g32", None),
}


def synthetic(path: Path, sym: bool, widths, group: int, seed: int = 0) -> Path:
    """A matgptq checkpoint of stories260K with random codes: shift-0 layers of `widths` (int or {layer: width})."""
    gen = torch.Generator().manual_seed(seed)
    fp = load_file(str(STORIES / "model.safetensors"))
    config = json.loads((STORIES / "config.json").read_text())
    layers = {}
    for name in LAYERS:
        n, k = fp[f"{name}.weight"].shape
        layers[name] = _layer(n, k, sym, False, gen, widths if isinstance(widths, int) else widths[name], group)
    tensors = {k: v for k, v in fp.items() if k.removesuffix(".weight") not in layers}
    meta = {
        "quantization": {
            "method": "gptq",
            "bits": widths if isinstance(widths, int) else 8,
            "group_size": group,
            "sym": sym,
            "act_order": False,
        }
    }
    return save_checkpoint(path, config, tensors, layers, meta, STORIES)


class Cache:
    """Each source and export built once per module."""

    def __init__(self, base: Path):
        self.base, self.items = base, {}
        self.ids = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(0))

    def _get(self, key, make):
        if key not in self.items:
            self.items[key] = make()
        return self.items[key]

    def source(self, name: str) -> Path:
        return self._get(("src", name), lambda: synthetic(self.base / f"src-{name}", *SOURCES[name]))

    def bits(self, export_id: str):
        bits = EXPORTS[export_id][1]
        return MIX if bits == "MIX" else bits

    def export(self, export_id: str) -> Path:
        def make():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the ragged layers' notice (tests/exporters cover it)
                return export_compressed_tensors(
                    self.source(EXPORTS[export_id][0]), self.base / f"ct-{export_id}", bits=self.bits(export_id)
                )

        return self._get(("ct", export_id), make)

    def reference(self, export_id: str, dtype=torch.float32):
        """matgptq.load of the source at the export's widths (dense)."""
        src = self.source(EXPORTS[export_id][0])
        return matgptq.load(src, bits=self.bits(export_id), dtype=dtype, packed=False)


def quantization_config(qc: dict):
    """compressed-tensors' own QuantizationConfig of a `quantization_config` dict."""
    from compressed_tensors.quantization import QuantizationConfig

    return QuantizationConfig.model_validate({k: v for k, v in qc.items() if k in QuantizationConfig.model_fields})


def ct_weights(out: Path) -> dict[str, torch.Tensor]:
    """{Linear: weight} as compressed-tensors reads the checkpoint `out`: its apply_quantization_config matches the
    config groups to the model's modules (targets, regexes, class names, ignore), and PackedQuantizationCompressor
    decompresses each matched module's tensors from the file. Nothing of matgptq's reader is used."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import apply_quantization_config
    from transformers import AutoConfig, AutoModelForCausalLM

    config = json.loads((out / "config.json").read_text())
    qc = config.pop("quantization_config")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    apply_quantization_config(model, quantization_config(qc), show_progress=False)
    raw = {}
    for f in sorted(out.glob("*.safetensors")):
        raw.update(load_file(str(f)))
    weights = {}
    for name, module in model.named_modules():
        scheme = getattr(module, "quantization_scheme", None)
        if scheme is None:
            continue
        keys = PackedQuantizationCompressor.compression_param_names(scheme)
        sd = {key: raw[f"{name}.{key}"] for key in keys if f"{name}.{key}" in raw}
        weights[name] = PackedQuantizationCompressor.decompress(sd, scheme)["weight"]
    return weights


def edit_config(out: Path, edit) -> None:
    """Apply `edit` to config.json's quantization_config in place."""
    config = json.loads((out / "config.json").read_text())
    edit(config["quantization_config"])
    (out / "config.json").write_text(json.dumps(config))
