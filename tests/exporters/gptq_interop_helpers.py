"""Helpers of the GPTQ interop tests (tests/exporters/test_gptq_interop*.py): the export matrix, a cache of quantized
sources, exports and reference logits, the peer-kernel reference model, and the comparison whose assertions
test_gptq_interop.py's module docstring explains. No peer is imported here: the tests import GPTQModel themselves
(fixture `gptqmodel` in conftest.py), this module only when a helper runs."""

import json
import warnings

import torch

import matgptq
from matgptq.exporters.gptq import export_gptq
from matgptq.formats.gptq import gptq_layer
from matgptq.formats.gptq.reader import read_gptq_checkpoint
from tests.conftest import TINYSTORIES

GROUP = 32
CALIB = ["Once upon a time there was a little girl who liked to play in the park with her dog. " * 8] * 4
BITS = (2, 3, 4, 8)
MATRIX = [
    (b, sym, fmt, ao)
    for b in BITS
    for sym in (True, False)
    for fmt in ("gptq_v1", "gptq_v2")
    for ao in (False, True)
    if sym or fmt == "gptq_v2"
]  # asymmetric v1 is refused (test_gptq_export.py)


def _ids(cases):
    return [f"{b}bit-{'sym' if s else 'asym'}-{f}-{'act_order' if a else 'plain'}" for b, s, f, a in cases]


IDS = _ids(MATRIX)


class Cache:
    """Quantized sources, exports and reference logits, built on first use and shared by the whole module."""

    def __init__(self, model_dir, base, widths=BITS, nsamples=8):
        self.model_dir, self.base, self.items, self.widths, self.nsamples = model_dir, base, {}, widths, nsamples
        self.ids = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(0))

    def _get(self, key, make):
        if key not in self.items:
            self.items[key] = make()
        return self.items[key]

    def source(self, sym, bits, ao):
        """Symmetric: one MatGPTQ parent (2,3,4,8) sliced; asymmetric: a plain GPTQ r-bit checkpoint (shift 0)."""
        key = ("src", sym, None if sym else bits, ao)
        kw = dict(method="matgptq", bits=self.widths) if sym else dict(method="gptq", bits=bits, sym=False)
        return self._get(
            key,
            lambda: matgptq.quantize(
                self.model_dir,
                self.base / "-".join(map(str, key)),
                calib=CALIB,
                nsamples=self.nsamples,
                seqlen=64,
                progress=False,
                group_size=GROUP,
                act_order=ao,
                static_groups=False,
                **kw,
            )[0],
        )

    def export(self, bits, sym, fmt, ao):
        out = self.base / f"export-{bits}-{sym}-{fmt}-{ao}"
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "(?s).*zero-padded", UserWarning)  # stories260K; test_gptq_export_padded
            return self._get(out, lambda: export_gptq(self.source(sym, bits, ao), out, fmt, bits=bits))

    def reference(self, src, bits, dtype):
        """Logits and the model of matgptq.load(src, bits) in `dtype`."""

        def make():
            model = matgptq.load(src, bits=bits, dtype=dtype)
            with torch.no_grad():
                return model(self.ids).logits.float(), model

        return self._get(("ref", str(src), json.dumps(bits, sort_keys=True), str(dtype)), make)

    def peer_reference(self, src, bits, kernel: type, sym: bool) -> torch.Tensor:
        """Logits of matgptq.load(src, bits) with every quantized Linear run by the peer's `kernel` on our data."""

        def make():
            with torch.no_grad():
                return peer_kernel_model(src, bits, kernel, sym)(self.ids).logits.float()

        return self._get(("peer", str(src), json.dumps(bits, sort_keys=True), kernel.__name__, sym), make)


def peer_kernel_model(src, bits, kernel: type, sym: bool):
    """matgptq.load(src, bits) in float16, each quantized Linear replaced by `kernel` (a GPTQModel quant-linear class)
    packed by GPTQModel's own packer from the QuantizedWeight we hold in memory: the peer's arithmetic on our data."""
    model = matgptq.load(src, bits=bits, dtype=torch.float16)
    state = model.matgptq
    for name, r in state.bits.items():
        q = state.layers[name].slice(r)
        n, k = q.shape
        assert model.get_submodule(name).bias is None  # Llama; a bias would have to be handed to the kernel too
        _, scales, zeros = gptq_layer(name, q)
        linear = torch.nn.Linear(k, n, bias=False)
        linear.weight.data = q.dequantize()  # s·(q − z), exact in fp32; the packer recovers q = round(W/s + z)
        act_order = not torch.equal(q.g_idx, torch.arange(k, dtype=torch.int32) // GROUP)
        ql = kernel(
            bits=r,
            group_size=GROUP,
            sym=sym,
            desc_act=act_order,
            in_features=k,
            out_features=n,
            bias=False,
            pack_dtype=torch.int32,
        )
        args = (linear, torch.from_numpy(scales).float(), torch.from_numpy(zeros).float(), q.g_idx)
        try:
            ql.pack_block(*args)
        except ValueError:  # shapes pack_block refuses (stories260K's 172): GPTQModel's pack_module falls back so too
            ql.pack_original(*args)
        ql.post_init()
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, ql.eval())
    return model


def _compare(cache, record_property, peer, logits, src, bits, sym, peer_weights):
    """Assert the peer's weights and logits against ours (test_gptq_interop.py's module docstring); record the
    differences to our own float16/float32 models for the compat table (informational: they depend on the CPU's
    float16 GEMM paths)."""
    kernels = {type(m) for m in _quant_modules(peer).values()}
    assert len(kernels) == 1, kernels
    ref = cache.peer_reference(src, bits, kernels.pop(), sym)
    ref16, model16 = cache.reference(src, bits, torch.float16)
    ref32, _ = cache.reference(src, bits, torch.float32)
    scale = float(ref32.abs().max())
    d_ref = float((logits - ref).abs().max()) / scale
    record_property("rel_diff_vs_peer_kernel_ref", d_ref)
    record_property("rel_diff_vs_fp16", float((logits - ref16).abs().max()) / scale)
    record_property("rel_diff_vs_fp32", float((logits - ref32).abs().max()) / scale)
    for name, w in peer_weights.items():
        assert torch.equal(w.to(torch.float16), model16.get_submodule(name).weight), (
            f"{name}: the peer's weights differ"
        )
    assert torch.equal(logits, ref), f"logits differ from the peer's kernel run on our data by {d_ref:.2e} (relative)"


def _quant_modules(model) -> dict:
    from gptqmodel.nn_modules.qlinear import BaseQuantLinear

    return {n: m for n, m in model.named_modules() if isinstance(m, BaseQuantLinear)}


def _gptqmodel_weights(gm, model):
    with torch.no_grad():
        return {n: m.dequantize_weight().T for n, m in _quant_modules(model).items()}


def _gptqmodel_logits(gm, path, ids):
    model = gm.GPTQModel.load(str(path), backend=gm.BACKEND.GPTQ_TORCH, device="cpu", dtype=torch.float16)
    with torch.no_grad():
        return model.model(ids).logits.float(), model.model


def _check_we_read_gptqmodel(gm, cache, record_property, out, bits, sym, fmt, ao):
    """GPTQModel quantizes cache.model_dir and saves `out`; matgptq.load must give its weights, and GPTQModel's logits
    must equal its own kernel run on the data matgptq read (test_gptq_interop.py's module docstring)."""
    text = TINYSTORIES.read_text()[:20000] if TINYSTORIES.is_file() else " ".join(CALIB) * 20
    calib = [text[i * 1000 : (i + 1) * 1000] for i in range(16)]
    qcfg = gm.QuantizeConfig(bits=bits, group_size=GROUP, sym=sym, desc_act=ao, format=fmt)
    model = gm.GPTQModel.load(str(cache.model_dir), qcfg)
    model.quantize(calib, batch_size=4)
    model.save(str(out))
    ckpt = read_gptq_checkpoint(out)
    assert ckpt.meta["checkpoint_format"] == fmt and {q.bits for q in ckpt.layers.values()} == {bits}
    assert (
        any(
            not torch.equal(q.g_idx, torch.arange(q.shape[1], dtype=torch.int32) // GROUP) for q in ckpt.layers.values()
        )
        == ao
    )
    logits, peer = _gptqmodel_logits(gm, out, cache.ids)
    ours = matgptq.load(out, dtype=torch.float16)
    for name, w in _gptqmodel_weights(gm, peer).items():
        assert torch.equal(w.to(torch.float16), ours.get_submodule(name).weight), name
    with torch.no_grad():
        d16 = float((ours(cache.ids).logits.float() - logits).abs().max()) / float(logits.abs().max())
    record_property("rel_diff_vs_fp16", d16)
    kernels = {type(m) for m in _quant_modules(peer).values()}
    assert len(kernels) == 1, kernels
    ref = cache.peer_reference(out, None, kernels.pop(), sym)
    record_property("rel_diff_vs_peer_kernel_ref", float((logits - ref).abs().max()) / float(logits.abs().max()))
    assert torch.equal(logits, ref)
    return ckpt
