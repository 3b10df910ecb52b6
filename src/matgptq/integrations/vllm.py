"""vLLM serves a matgptq parent (or slice) at its stored widths or at any other width or mix, without re-quantizing:
a quantization method named "matgptq" that vLLM's plugin entry point registers (pyproject.toml,
`vllm.general_plugins`: vLLM calls `register` in every process it starts, its spawned workers included).

    from vllm import LLM
    llm = LLM(PARENT, quantization="matgptq")                                             # as stored
    llm = LLM(PARENT, quantization="matgptq",
              hf_overrides={"quantization_config": {"quant_method": "matgptq", "bits": 3}})  # or "mix.json", {...}

`bits` takes what `matgptq.load` and transformers' `MatGPTQQuantizationConfig` take: one width, a {layer: bits} mix
("*" = default) or the path of a mix JSON file (`matgptq search` writes one);
`matgptq.MatGPTQQuantizationConfig(bits=3).to_dict()` is such a dict too. hf_overrides is vLLM's way to change a
checkpoint's config.json: the dict replaces its quantization_config, `{"quant_method": "matgptq", "bits": stored}`
(formats/parent.py), which is read as the stored widths (so a mixed-width GPTQ checkpoint's own config is not read as
"every layer at its widest"). A width a layer cannot take is one `UserError` out of `LLM(...)`, naming the widths
that exist (runtime.state.resolve_bits).

How it loads: `MatGPTQVllmConfig.maybe_update_config` reads the parent's matgptq.json (formats.parent.read_layout: no
tensor is read) and resolves the widths, in the process that builds vLLM's config. For each Linear vLLM builds
(q/k/v fused as qkv_proj, gate/up as gate_up_proj: its `packed_modules_mapping`), `get_quant_method` finds the
parent's layers behind it; `MatGPTQLinearMethod` creates vLLM's own dense `weight` (as for an unquantized layer)
plus an empty placeholder for each tensor a parent stores per layer (`.codes`, `.scales`, `.zeros`, `.g_idx`,
`.perm`, `.scales.<r>` renamed `.scales_<r>` by `get_checkpoint_weight_mapper`, as a parameter name has no dot).
vLLM's loader hands each stored tensor to its placeholder's weight loader with the shard id of the layer it came from
("q"/"k"/"v", 0/1); the loader keeps it aside under that layer's name. After loading, each shard is read as the
checkpoint reader reads it (formats.parent.read_layer: checked, codes unpacked), sliced to its own width and
dequantized (QuantizedWeight.slice/dequantize, formats/slicing.py: the arithmetic of `matgptq.load`'s dense layers),
and given to vLLM's weight loader of the dense weight with the same shard id, which places it (and narrows it to
this rank's part under tensor parallelism). Shards of one fused layer may so take different widths. The quantized
layers' tensors are checked against the checksums the file records (formats/checksums.py); the others (embeddings,
norms) are read by vLLM alone, unchecked. Then vLLM's
unquantized path takes over: on the CPU its oneDNN GEMM, on a GPU its dense GEMM (F.linear).

GPU: the weights are dequantized there too (on the GPU itself), not served by the nested Triton kernels of
runtime/nested.py: a fused vLLM layer would need one nested layout per shard, cut to each rank's rows or columns, and
no GPU was at hand to test that on. Serving at r bits therefore takes the memory of the dense model;
`matgptq.load(PARENT, device="cuda")` runs the nested kernels. Mixture-of-experts layers are refused.
"""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path

import torch

from ..errors import UserError
from ..formats import Checkpoint, QuantizedWeight, checksums
from ..formats.parent import LAYER_TENSOR, META_FILE, WEIGHTS_FILE, Layout, read_layer, read_layout
from ..runtime import resolve_bits

METHOD = "matgptq"
FIELDS = {
    "codes": torch.uint8,
    "scales": torch.float16,
    "zeros": torch.uint8,
    "g_idx": torch.int32,
    "perm": torch.int32,
}  # a stored layer's tensors (formats/parent.py) besides its per-width scales
WIDTH_SCALES = re.compile(r"\.scales\.(\d)$")  # <name>.scales.<r> → <name>.scales_<r>: a parameter name has no dot
QKV = {"q": 0, "k": 1, "v": 2}  # vLLM's shard ids of a fused q/k/v layer, in packed_modules_mapping's order


def checkpoint_dir(model: str, revision: str | None) -> Path:
    """The local directory of vLLM's `model`: itself, or matgptq.json and config.json fetched from the Hub."""
    if Path(model).is_dir():
        return Path(model)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, revision=revision, allow_patterns=[META_FILE, "config.json"]))
    except Exception as e:  # noqa: BLE001 — any failure is one line: the file is required
        raise UserError(
            f"vLLM's model {model} is no directory and its {META_FILE} could not be fetched "
            f"({type(e).__name__}); download the whole checkpoint and give its directory"
        ) from None


def requested_bits(quantization_config: dict, layout: Layout):
    """The width spec asked for: None (the stored widths) for the checkpoint's own quantization_config (formats/
    parent.py writes {"quant_method", "bits": stored_bits}); else its `bits` (None: stored)."""
    if quantization_config == {"quant_method": METHOD, "bits": layout.meta["stored_bits"]}:
        return None
    return quantization_config.get("bits")


def resolve_widths(spec, layout: Layout) -> dict[str, int]:
    """Each quantized layer's width for `spec` (an int, a mix or a mix file) through runtime.state.resolve_bits, on
    a checkpoint of meta tensors: only the layout is known here, and no tensor is read."""
    layers, meta = {}, partial(torch.empty, device="meta")
    for name, (n, k) in layout.shapes.items():
        layers[name] = QuantizedWeight(
            codes=meta(n, k, dtype=torch.uint8),
            scales=meta(n, 1, dtype=torch.float16),
            zeros=meta(n, 1, dtype=torch.uint8),
            g_idx=meta(k, dtype=torch.int32),
            bits=layout.widths[name],
            shift=layout.shift,
        )
    return resolve_bits(spec, Checkpoint(layout.meta, layout.config, layers, {}, layout.path))


def layer_names(prefix: str, mapping: dict[str, list[str]]) -> list[str]:
    """The checkpoint layers behind vLLM's layer `prefix`: its shards for a fused one (qkv_proj → q, k, v)."""
    parent, _, last = prefix.rpartition(".")
    return [f"{parent}.{s}" if parent else s for s in mapping[last]] if last in mapping else [prefix]


def quantized_names(config, prefix: str, other: str | None) -> list[str] | None:
    """The checkpoint layers behind vLLM's layer `prefix` (a Linear, or a layer of the class named `other`), None
    where it is not quantized. What the plugin cannot serve is a UserError: a fused group quantized in part, or a
    quantized layer vLLM runs as no Linear (mixture-of-experts, lm_head)."""
    if config.layout is None:
        raise UserError("vLLM asked for matgptq layers before reading the checkpoint (maybe_update_config)")
    layers = config.layout.shapes
    if other is not None:
        if any(n == prefix or n.startswith(prefix + ".") for n in layers):
            raise UserError(
                f"{prefix} is a quantized {other} in vLLM; the matgptq plugin serves quantized Linear "
                "layers only (no mixture-of-experts, no lm_head)"
            )
        return None
    names = [config.renamed.get(n, n) for n in layer_names(prefix, config.packed_modules_mapping)]
    quantized = [n in layers for n in names]
    if not any(quantized):
        return None
    if not all(quantized):
        raise UserError(
            f"vLLM runs {names} as one layer ({prefix}), and the checkpoint quantizes only some of them; "
            "re-quantize them together"
        )
    return names


def dense_shard(raw: dict, layout: Layout, name: str, bits: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Layer `name` of the checkpoint from its stored tensors in `raw`, read and checked as the checkpoint reader
    does (its checksums included), at `bits` and in `dtype` on `device` (the arithmetic of matgptq.load's dense
    layers)."""
    n, k = layout.shapes[name]
    where = layout.path / WEIGHTS_FILE
    if layout.sums is not None and checksums.wanted():
        checksums.verify(where, {key: t for key, t in raw.items() if LAYER_TENSOR.sub("", key) == name}, layout.sums)
    q = read_layer(where, raw, name, n, k, layout.widths[name], layout.shift)
    return q.to(device).slice(bits).dequantize(dtype)


def _linear_method_class():
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.utils import set_weight_attrs

    class MatGPTQLinearMethod(UnquantizedLinearMethod):
        """One vLLM Linear (possibly fused) of a parent: placeholders receive the stored tensors; after loading,
        the dense weight is written from them (module docstring) and the unquantized path computes."""

        supports_pre_processed_weights = False  # the weight is made after loading, from the stored tensors

        def __init__(self, config, names: list[str]) -> None:
            super().__init__()
            self.config, self.names = config, names
            self.raw: dict[str, torch.Tensor] = {}
            self.shard_ids: dict[int, object] = {}

        def create_weights(
            self,
            layer,
            input_size_per_partition,
            output_partition_sizes,
            input_size,
            output_size,
            params_dtype,
            **extra_weight_attrs,
        ):
            super().create_weights(
                layer,
                input_size_per_partition,
                output_partition_sizes,
                input_size,
                output_size,
                params_dtype,
                **extra_weight_attrs,
            )
            widths = [self.config.layout.widths[n] for n in self.names]
            fields = {**FIELDS, **{f"scales_{r}": torch.float16 for r in range(2, max(widths))}}
            for field, dtype in fields.items():
                placeholder = torch.nn.Parameter(torch.empty(0, dtype=dtype), requires_grad=False)
                set_weight_attrs(placeholder, {"weight_loader": partial(self.receive, field)})
                layer.register_parameter(field, placeholder)
            self.fields = list(fields)

        def receive(self, field: str, param, loaded: torch.Tensor, shard_id=None) -> None:
            """vLLM's weight loader of a placeholder: keep the stored tensor under its layer's name."""
            index = QKV.get(shard_id, shard_id) if shard_id is not None else 0
            if not isinstance(index, int) or not 0 <= index < len(self.names):
                raise UserError(f"vLLM gave shard {shard_id!r} of {self.names}: a fused layer matgptq cannot place")
            self.shard_ids[index] = shard_id
            key = f"{self.names[index]}.{field.replace('scales_', 'scales.')}"  # the checkpoint's tensor name
            self.raw[key] = loaded.detach().to("cpu", copy=True)

        def process_weights_after_loading(self, layer) -> None:
            weight = layer.weight
            for index, name in enumerate(self.names):
                w = dense_shard(
                    self.raw, self.config.layout, name, self.config.widths[name], weight.dtype, weight.device
                )
                shard = self.shard_ids.get(index)
                weight.weight_loader(weight, w) if shard is None else weight.weight_loader(weight, w, shard)
            self.raw.clear()
            for field in self.fields:
                delattr(layer, field)
            super().process_weights_after_loading(layer)

    return MatGPTQLinearMethod


def _config_class():
    from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
    from vllm.model_executor.layers.quantization import QuantizationConfig
    from vllm.model_executor.models.utils import WeightsMapper

    class MatGPTQVllmConfig(QuantizationConfig):
        """The "matgptq" quantization method (module docstring): the checkpoint's quantization_config or the one
        hf_overrides gives; the layout and widths are read by `maybe_update_config`."""

        def __init__(self, quantization_config: dict) -> None:
            super().__init__()
            self.quantization_config = dict(quantization_config)
            self.layout: Layout | None = None
            self.widths: dict[str, int] = {}
            self.renamed: dict[str, str] = {}  # vLLM's name of a layer → the checkpoint's, where vLLM renames it

        def get_name(self) -> str:
            return METHOD

        def get_supported_act_dtypes(self) -> list[torch.dtype]:
            return [torch.bfloat16, torch.float16, torch.float32]

        @classmethod
        def get_min_capability(cls) -> int:
            return 0  # dense weights: any GPU vLLM runs on

        @staticmethod
        def get_config_filenames() -> list[str]:
            return []  # config.json's quantization_config says everything; matgptq.json is read beside it

        @classmethod
        def from_config(cls, config: dict) -> "MatGPTQVllmConfig":
            return cls(config)

        def maybe_update_config(self, model_name: str, hf_config=None, revision: str | None = None) -> None:
            self.layout = read_layout(checkpoint_dir(model_name, revision))
            self.widths = resolve_widths(requested_bits(self.quantization_config, self.layout), self.layout)

        def apply_vllm_mapper(self, hf_to_vllm_mapper) -> None:
            names = self.layout.shapes if self.layout else {}
            self.renamed = {m: n for n in names if (m := hf_to_vllm_mapper.map_name(n)) not in (None, n)}

        @staticmethod
        def get_checkpoint_weight_mapper() -> WeightsMapper:
            """<name>.scales.<r> to its placeholder's name; g_idx is kept (vLLM's default mapper drops it)."""
            return WeightsMapper(orig_to_new_regex={WIDTH_SCALES: r".scales_\1"})

        def get_quant_method(self, layer, prefix: str):
            linear = isinstance(layer, LinearBase)
            names = quantized_names(self, prefix, type(layer).__name__ if not linear else None)
            if names is None:
                return UnquantizedLinearMethod() if linear else None
            return _classes()["MatGPTQLinearMethod"](self, names)

    return MatGPTQVllmConfig


_CLASSES: dict[str, type] = {}
_BUILDERS = {"MatGPTQVllmConfig": _config_class, "MatGPTQLinearMethod": _linear_method_class}


def _classes() -> dict[str, type]:
    """The vLLM classes, built once (vLLM is imported here, not when matgptq is); as attributes of this module
    (`__getattr__`), so pickle finds them by name in vLLM's worker processes."""
    if not _CLASSES:
        for name, build in _BUILDERS.items():
            cls = build()
            cls.__qualname__ = cls.__name__ = name
            _CLASSES[name] = cls
    return _CLASSES


def __getattr__(name: str):
    if name in _BUILDERS:
        return _classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register() -> None:
    """vLLM's `vllm.general_plugins` entry point: register the "matgptq" quantization method (vLLM loads plugins once
    per process; a second call changes nothing)."""
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, register_quantization_config

    if METHOD not in QUANTIZATION_METHODS:
        register_quantization_config(METHOD)(_classes()["MatGPTQVllmConfig"])
