"""transformers' `from_pretrained` for matgptq checkpoints: a quantization method registered from outside
transformers (`register_quantization_config` / `register_quantizer`), active once `matgptq` is imported.

    import matgptq
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(PARENT)                                  # as stored
    config = matgptq.MatGPTQQuantizationConfig(bits=3)                                     # another width
    model = AutoModelForCausalLM.from_pretrained(PARENT, quantization_config=config)

How it loads: transformers builds the model on the meta device and calls `_process_model_before_weight_loading`,
which reads and checks the checkpoint (formats/parent.py: every tensor of its files against its checksum, those
transformers loads included) and puts a bias-only placeholder where each quantized
Linear is, so transformers loads every unquantized tensor itself and neither allocates nor initialises the quantized
weights; the checkpoint's quantized tensors (`.codes`, `.scales`, …) are declared expected-unused. After loading,
`_process_model_after_weight_loading` puts the Linears back and hands the model to `loader.attach`, the function
`matgptq.load` ends with, so both give the same modules (packed where `load` packs) and the same logits, and
`matgptq.set_bits` switches widths on either.

`MatGPTQQuantizationConfig(bits=...)` (named apart from the method config `matgptq.MatGPTQConfig`, which quantizes;
transformers knows it by its `quant_method`, "matgptq", which is what config.json stores) overrides the stored widths
only because transformers copies a passed config's loading attributes onto the checkpoint's for the config types in
`transformers.quantizers.auto.LOADING_ATTRIBUTES_CONFIG_TYPES`, a module-level tuple read at call time; `register`
appends MatGPTQQuantizationConfig to it (tested on both transformers versions of exporters/tested.py). transformers
then warns, as it does for its own GPTQ backends, that the checkpoint's config is used, "However, loading attributes
(e.g. ['bits', 'packed']) will be overwritten with the one you passed". `save_pretrained` would write runtime
buffers, not a checkpoint, so it is refused (`is_serializable`) with the command that writes a slice.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import torch
from torch import nn

from ..errors import UserError
from ..formats import read_checkpoint
from ..formats.parent import LAYER_TENSOR, META_FILE
from ..models import arch_spec, quiet_loggers, weight_keys
from ..models.experts import parse
from ..runtime import Packing, attach, check_layers, default_packing

METHOD = "matgptq"


class _Pending(nn.Module):
    """Where a quantized Linear sits while transformers loads: only its bias (an ordinary checkpoint tensor), so no
    weight is allocated or initialised; the original module (on meta) is kept aside, not registered."""

    def __init__(self, original: nn.Module) -> None:
        super().__init__()
        self.__dict__["original"] = original
        self.bias = original.bias


def _checkpoint_dir(checkpoint_files: list[str] | None, config) -> Path:
    """The directory holding the weights transformers resolved; matgptq.json is fetched beside them from the Hub when
    transformers did not (it downloads only the config and the weights)."""
    if not checkpoint_files:
        raise UserError("transformers found no weight files for this matgptq checkpoint; give its directory")
    where = Path(checkpoint_files[0]).parent
    if not (where / META_FILE).is_file():
        repo = getattr(config, "name_or_path", "")
        try:
            from huggingface_hub import hf_hub_download

            hf_hub_download(repo, META_FILE, revision=getattr(config, "_commit_hash", None) or where.name)
        except Exception as e:  # noqa: BLE001 — any failure is one line: the file is required
            raise UserError(
                f"{where} has no {META_FILE} and it could not be fetched for {repo or 'this model'} "
                f"({type(e).__name__}); download the whole checkpoint and give its directory"
            ) from None
    return where


def _config_class():
    from transformers.utils.quantization_config import QuantizationConfigMixin

    class MatGPTQQuantizationConfig(QuantizationConfigMixin):
        """Loading options for a matgptq checkpoint in `from_pretrained`: `bits` is one width for every layer (2 up to
        the stored width), a {layer: bits} mix ("*" = default) or the path of a mix JSON file (as `matgptq search`
        writes); None keeps the stored widths. `packed` as in `matgptq.load` (None: packed where that wins)."""

        def __init__(
            self,
            bits: int | dict[str, int] | str | Path | None = None,
            packed: bool | None = None,
            stored_bits: int | None = None,
            **kwargs,
        ) -> None:
            self.quant_method = METHOD
            self.bits = str(bits) if isinstance(bits, Path) else bits
            self.packed = packed
            self.stored_bits = stored_bits

        @classmethod
        def from_dict(cls, config_dict, return_unused_kwargs=False, **kwargs):
            """The checkpoint's config.json says `bits`: the stored width, not a width asked for."""
            d = {k: v for k, v in config_dict.items() if k != "bits"}
            d.setdefault("stored_bits", config_dict.get("bits"))
            return super().from_dict(d, return_unused_kwargs, **kwargs)

        def get_loading_attributes(self) -> dict:
            return {"bits": self.bits, "packed": self.packed}

    return MatGPTQQuantizationConfig


def _expect_fused_missing(model, checkpoint, spec) -> None:
    """Fused expert tensors stored as quantized layers only are not in the file: transformers allocates them and
    `attach` writes them, so their absence is expected, not reported."""
    fused = weight_keys(set(checkpoint.layers), spec) - {f"{n}.weight" for n in checkpoint.layers}
    if fused:
        missing = model._keys_to_ignore_on_load_missing
        model._keys_to_ignore_on_load_missing = {*(missing or ()), *(f"^{re.escape(k)}$" for k in fused)}


def _quantizer_class():
    from transformers.quantizers.base import HfQuantizer

    class MatGPTQHfQuantizer(HfQuantizer):
        """Loads matgptq parents and slices (module docstring); it never quantizes."""

        requires_calibration = False  # a refusal of our own, clearer than transformers' (validate_environment)

        def validate_environment(self, *args, **kwargs) -> None:
            if not self.pre_quantized:
                raise UserError(
                    "matgptq quantizes with its own command, not inside from_pretrained: run `matgptq "
                    "quantize MODEL --out DIR`, then from_pretrained(DIR)"
                )

        def _process_model_before_weight_loading(self, model, checkpoint_files=None, **kwargs):
            # the quantized layers only: transformers loads the other tensors itself. On the CPU: transformers calls
            # this under its init context, whose default device is meta (a perm's check would compare meta tensors)
            with torch.device("cpu"):
                self.checkpoint = read_checkpoint(_checkpoint_dir(checkpoint_files, model.config), layers_only=True)
            spec = arch_spec(model)
            check_layers(self.checkpoint, model, spec)
            for name in self._linears(spec):
                model.set_submodule(name, _Pending(model.get_submodule(name)))
            ignore = model._keys_to_ignore_on_load_unexpected
            model._keys_to_ignore_on_load_unexpected = {*(ignore or ()), LAYER_TENSOR.pattern}
            _expect_fused_missing(model, self.checkpoint, spec)
            return model

        def _linears(self, spec):
            """The quantized layers that are modules (not experts of fused tensors, models/experts.py)."""
            return [n for n in self.checkpoint.layers if parse(n, spec.experts) is None]

        def _process_model_after_weight_loading(self, model, **kwargs):
            devices = {t.device for t in model.state_dict().values()}
            if len(devices) > 1:
                raise UserError(
                    f"a matgptq model loads on one device, not {len(devices)}: pass device_map=None, 'cpu' or 'cuda'"
                )
            device, dtype = devices.pop(), model.get_input_embeddings().weight.dtype
            cfg = self.quantization_config
            packing = default_packing(cfg.packed, dtype, arch_spec(model).conv1d, device)
            # where set_bits writes float weights: DENSE on the device; NESTED on the CPU (untouched, so never
            # committed), where its layers are built and those the kernels cannot serve are written, then moved with
            # the model, so the GPU receives the packed layers only (as matgptq.load does)
            home = {Packing.DENSE: device, Packing.NESTED: torch.device("cpu")}.get(packing)
            for name in self._linears(arch_spec(model)):
                pending = model.get_submodule(name)
                module = pending.original
                if home is not None:
                    module.weight = nn.Parameter(torch.empty_like(module.weight, device=home), requires_grad=False)
                module.bias = pending.bias
                model.set_submodule(name, module)
            attach(model, self.checkpoint, cfg.bits, packing)
            model.to(device)
            return model

        def is_serializable(self, *args, **kwargs) -> bool:
            raise UserError(
                "save_pretrained cannot write a matgptq model (it would write runtime buffers, not a "
                "checkpoint): write a width with `matgptq slice PARENT --bits R --out DIR`, or a mix for "
                "other runtimes with `matgptq export PARENT --bits-config MIX ...`"
            )

        @property
        def is_trainable(self) -> bool:
            return False

    return MatGPTQHfQuantizer


# transformers' quantizer registry imports every quantization backend installed (torchao among them), whose import
# logs notes about optional native libraries and pytree registrations: not the user's concern when importing matgptq
IMPORT_LOGGERS = ("torchao", "torch.utils._pytree")


def register():
    """Register the method with transformers (once per process); the config class, or None where this transformers
    has no registration API (before 4.47): then `from_pretrained` refuses matgptq checkpoints as before."""
    try:  # the module itself: this runs right after it is first imported, inside its package's __init__ (__init__.py)
        with quiet_loggers(*IMPORT_LOGGERS):
            auto = importlib.import_module("transformers.quantizers.auto")
    except ImportError:
        return None
    if not hasattr(auto, "register_quantizer"):
        return None
    if METHOD in auto.AUTO_QUANTIZATION_CONFIG_MAPPING:
        return auto.AUTO_QUANTIZATION_CONFIG_MAPPING[METHOD]
    config = auto.register_quantization_config(METHOD)(_config_class())
    auto.register_quantizer(METHOD)(_quantizer_class())
    if hasattr(auto, "LOADING_ATTRIBUTES_CONFIG_TYPES"):
        auto.LOADING_ATTRIBUTES_CONFIG_TYPES = (*auto.LOADING_ATTRIBUTES_CONFIG_TYPES, config)
    return config
