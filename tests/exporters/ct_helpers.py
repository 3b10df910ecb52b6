"""Helpers of the compressed-tensors export tests (tests/exporters/test_compressed_tensors*.py): the sources and
exports checked (SOURCES, EXPORTS), a cache that quantizes and exports each once, and our slices in compressed-tensors
terms."""

import json
import warnings

import torch

import matgptq
from matgptq.exporters.compressed_tensors import export_compressed_tensors
from matgptq.runtime import open_checkpoint
from tests.conftest import STORIES, quick_quantize

TINY_LAYERS = [
    f"model.layers.{i}.{m}"
    for i in range(2)
    for m in (
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    )
]
MIX = {n: (2, 3, 4, 6, 8)[i % 5] for i, n in enumerate(TINY_LAYERS)}  # every width, 5 config groups
ASYM_MIX = {"*": 4, **{n: 3 for n in TINY_LAYERS[::3]}, **{n: 8 for n in TINY_LAYERS[1::4]}}

SOURCES = {  # name: (model, quantize options); "tiny" is conftest's random Llama (K = 64, 128)
    "sym-g32": ("tiny", dict(method="matgptq", bits=(2, 3, 4, 6, 8), group_size=32)),
    "sym-g64-ao": ("tiny", dict(method="matgptq", bits=(3, 4), group_size=64, act_order=True, static_groups=True)),
    "sym-channel": ("tiny", dict(method="gptq", bits=6, group_size=-1)),
    "asym-g64": ("tiny", dict(method="gptq", bits=4, sym=False, group_size=64)),
    "asym-mix": ("tiny", dict(method="gptq", bits_config=ASYM_MIX, sym=False, group_size=32)),
    "stories-sym-g32": (STORIES, dict(method="matgptq", bits=(2, 4, 8), group_size=32)),  # down_proj: 172 columns
    "stories-asym-channel": (STORIES, dict(method="gptq", bits=3, sym=False, group_size=-1)),
    "stories-skip": (STORIES, dict(method="gptq", bits=4, group_size=32, skip=("down_proj$",))),  # left unquantized
    "ao-dynamic": ("tiny", dict(method="gptq", bits=4, group_size=32, act_order=True, static_groups=False)),  # refused
    "asym-parent": ("tiny", dict(method="matgptq", bits=(4, 8), sym=False, group_size=32)),  # 4-bit slice refused
    "sym-g32-signed": ("tiny", dict(method="gptq", bits=4, target="gguf")),  # llama.cpp's grid: scales of either sign
}
EXPORTS = {  # id: (source, bits); None = the stored widths
    **{f"sym-g32-{b}bit": ("sym-g32", b) for b in (2, 3, 4, 6, 8)},
    "sym-g32-mix": ("sym-g32", "MIX"),
    "sym-g64-actorder-static-3bit": ("sym-g64-ao", 3),
    "sym-channel-6bit": ("sym-channel", 6),
    "asym-g64-4bit": ("asym-g64", 4),
    "asym-mix": ("asym-mix", None),
    "stories-sym-g32-ragged-4bit": ("stories-sym-g32", 4),
    "stories-sym-g32-ragged-2bit": ("stories-sym-g32", 2),
    "stories-asym-channel-3bit": ("stories-asym-channel", 3),
    "stories-skip-down-proj-4bit": ("stories-skip", 4),
    "sym-g32-signed-scales-4bit": ("sym-g32-signed", 4),
}


WARNINGS = {  # the export's one-line warnings: words -> the exports that must (and only they) say them
    "do not tile their rows": lambda e: "ragged" in e
}


class Cache:
    def __init__(self, tiny, base):
        self.tiny, self.base, self.items = tiny, base, {}
        self.ids = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(0))

    def _get(self, key, make):
        if key not in self.items:
            self.items[key] = make()
        return self.items[key]

    def source(self, name):
        model, kw = SOURCES[name]
        model = self.tiny if model == "tiny" else model
        return self._get(("src", name), lambda: quick_quantize(model, self.base / f"src-{name}", **kw))

    def bits(self, export_id):
        bits = EXPORTS[export_id][1]
        return MIX if bits == "MIX" else bits

    def export(self, export_id):
        def make():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = export_compressed_tensors(
                    self.source(EXPORTS[export_id][0]), self.base / f"ct-{export_id}", bits=self.bits(export_id)
                )
            said = " | ".join(str(w.message) for w in caught)
            for words, applies in WARNINGS.items():
                assert (words in said) == applies(export_id), (export_id, words, said)
            return out

        return self._get(("ct", export_id), make)

    def reference(self, export_id):
        """Logits and the float32 dense model of matgptq.load(source, bits)."""

        def make():
            model = matgptq.load(
                self.source(EXPORTS[export_id][0]), bits=self.bits(export_id), dtype=torch.float32, packed=False
            )
            with torch.no_grad():
                return model(self.ids).logits, model

        return self._get(("ref", export_id), make)


def _slices(cache, export_id):
    ckpt = open_checkpoint(cache.source(EXPORTS[export_id][0]))
    bits = cache.bits(export_id)
    widths = (
        {n: q.bits for n, q in ckpt.layers.items()}
        if bits is None
        else (bits if isinstance(bits, dict) else dict.fromkeys(ckpt.layers, bits))
    )
    return {n: ckpt.layers[n].slice(r) for n, r in widths.items()}, ckpt


def _config(out):
    return json.loads((out / "config.json").read_text())["quantization_config"]


def _schemes(qc):
    return {name: g["weights"] for g in qc["config_groups"].values() for name in g["targets"]}


def _per_column(t, weights, k):
    """[N, G'] (group or channel) → [N, K]: the value each column uses."""
    return t.repeat_interleave(k if weights["strategy"] == "channel" else weights["group_size"], dim=1)


def _expected(q):
    """Our slice in compressed-tensors terms, per column (module docstring of the exporter)."""
    r, d, idx = q.bits, q.shift, q.g_idx.long()
    zero = q.zeros.int()[:, idx]
    sym = bool((q.zeros.int() == 1 << (q.master_bits - 1)).all())
    return {
        "q": q.codes.int() - (1 << (r - 1)),
        "scale": q.scales.float()[:, idx] * float(1 << d),
        "zp": (zero >> d) - (1 << (r - 1)),
        "sym": sym,
    }
