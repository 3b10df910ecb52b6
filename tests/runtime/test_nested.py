"""Nested layers (runtime/nested.py) and `load(..., device="cuda")`'s packing (runtime/state.py): each quantized
layer's output equals x·Ŵ_rᵀ of the dequantized slice within a derived bound, for both residents; set_bits switches
widths (in place for Resident.PARENT, rebuilt at r bits per weight for Resident.SLICE); layers the kernels cannot serve
run dense with one notice line. Compiled on a CUDA GPU when TRITON_INTERPRET=0, otherwise in Triton's interpreter on
CPU tensors (tests/conftest.py), where the loader's NESTED packing is chosen explicitly (build_model).

Tolerance (derived, as in tests/kernels/test_triton_nested.py): with float32 x the kernels rebuild every weight
Ŵ_r[n, k] = s·(S·2^h − z) exactly (h = c − r; bit for bit against QuantizedWeight.slice, test_bitplanes.py) and
differ from the float64 reference only in float32 rounding. Every term they evaluate is a product of x_k with s,
S_k·2^h or z (a word's s·(2^h·Σ x·S − z·Σ x), or the generic path's Σ x·w), and every path takes at most K + 8
operations, so

    |y − x·Ŵᵀ| ≤ E = γ_{K+8}·Σ_k |x_k|·s·(S_k·2^h + z) + u·|x·Ŵᵀ|   (the last term: the float32 store),

γ_n = n·u/(1 − n·u), u = 2^-24. The magnitude s·(S·2^h + z) bounds |w| too, so E holds whichever order or grouping
the kernels use. A bias adds one float32 addition: |fl(ŷ + b) − (y + b)| ≤ E·(1 + u) + u·(|y| + |b|).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

import matgptq
from matgptq.errors import UserError
from matgptq.formats.parent import read_checkpoint
from matgptq.kernels.triton_nested import interpreting
from matgptq.runtime.loader import build_model
from matgptq.runtime.nested import NestedLinear, Resident
from matgptq.runtime.packed import weight_bytes
from matgptq.runtime.state import Packing, QuantizedState, default_packing
from tests.conftest import make_tiny_llama, quick_quantize, random_parent, require_peer

U32 = 2.0**-24
DEVICE = "cpu" if interpreting() else "cuda"
IDS = torch.tensor([[1, 5, 9, 200, 17, 300, 42, 7, 99, 488, 3, 64]])
# the interpreter itself (triton 3.6 with numpy 2) warns about a numpy scalar conversion: not ours
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning")


@pytest.fixture
def kernels():
    """The tests that run the kernels: Triton installed, and a device that runs them."""
    require_peer("triton")  # the kernels extra (MATGPTQ_REQUIRE_PEERS=1 fails instead of skipping)
    if not interpreting() and not torch.cuda.is_available():
        pytest.skip("TRITON_INTERPRET=0 and no CUDA device: nothing can run the kernels")


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    root = tmp_path_factory.mktemp("nested")
    model = make_tiny_llama(root / "m", intermediate=96)  # down_proj K = 96: three plane words
    return quick_quantize(
        model, root / "p", method="matgptq", bits="3,4,8", group_size=32, act_order=True, static_groups=False
    )


def bound(x, q, bits, bias=None):
    """(tolerance, float64 reference) of y = x Ŵ_rᵀ + b for the r-bit slice of `q` (module doc)."""
    x = x.detach().double().cpu().reshape(-1, x.shape[-1])
    sl = q.slice(bits)
    g = sl.g_idx.long()
    magnitude = sl.scales.double()[:, g] * (sl.codes.double() * 2.0**sl.shift + sl.zeros.double()[:, g])
    n = x.shape[-1] + 8
    ref = x @ sl.dequantize().double().t()
    tol = n * U32 / (1 - n * U32) * (x.abs() @ magnitude.t()) + U32 * ref.abs()
    if bias is not None:
        b = bias.detach().double().cpu()
        tol, ref = tol * (1 + U32) + U32 * (ref.abs() + b.abs()), ref + b
    return tol + 1e-30, ref


def check(y, x, q, bits, bias=None):
    tol, ref = bound(x, q, bits, bias)
    err = (y.detach().double().cpu().reshape(ref.shape) - ref).abs()
    assert (err <= tol).all(), f"max error {float(err.max()):.3g}, its bound {float(tol.flatten()[err.argmax()]):.3g}"


@pytest.mark.parametrize("resident", list(Resident))
@pytest.mark.parametrize("bits", [2, 3, 8])
@pytest.mark.parametrize("rows", [3, 11])  # GEMV and GEMM
def test_layer_matches_the_dequantized_slice(kernels, resident, bits, rows):
    q = random_parent(40, 150, 32, True, width_scales=True, seed=bits)  # act-order, a short last group, odd shapes
    bias = torch.randn(40, generator=torch.Generator().manual_seed(3)) if rows == 3 else None
    layer = NestedLinear(q, bits, bias, torch.float32, resident).to(DEVICE)
    assert layer.planes.shape == ((bits if resident is Resident.SLICE else 8), math.ceil(150 / 32), 40)
    assert torch.equal(layer.dequantized_weight().cpu(), q.slice(bits).dequantize())
    x = torch.randn(rows, 150, generator=torch.Generator().manual_seed(rows))
    y = layer(x.to(DEVICE))
    assert y.shape == (rows, 40) and y.dtype == torch.float32
    check(y, x, q, bits, bias)


def test_parent_switches_in_place_and_a_slice_refuses(kernels):
    q = random_parent(24, 64, 32, False, width_scales=True, seed=1)
    layer = NestedLinear(q, 3, None, torch.float32, "parent").to(DEVICE)
    ptrs = [b.data_ptr() for b in layer.buffers()]
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(0))
    for bits in (4, 6, 8, 2):
        layer.set_width(bits)
        check(layer(x.to(DEVICE)), x, q, bits)
    assert [b.data_ptr() for b in layer.buffers()] == ptrs and layer.widths == tuple(range(1, 9))
    with pytest.raises(UserError, match="serves widths 1..8, not 9"):
        layer.set_width(9)
    one = NestedLinear(q, 3, None, torch.float32, Resident.SLICE)
    one.set_width(3)  # its own width: nothing to do
    with pytest.raises(UserError, match="resident='parent'") as e:
        one.set_width(4)
    assert "\n" not in str(e.value) and one.widths == (3,)


def nested_model(path, bits, resident):
    """The NESTED model on DEVICE: load(device="cuda") on a GPU; on the CPU the interpreter, chosen explicitly."""
    if DEVICE == "cuda":
        model = matgptq.load(path, bits=bits, device="cuda", resident=resident)
        assert model.matgptq.packing is Packing.NESTED
        return model
    return build_model(read_checkpoint(path), bits, packed=Packing.NESTED, resident=resident)


def run_and_check(model, ids):
    """Logits of `ids`; every NestedLinear's output equals its dequantized slice on its own input (module doc)."""
    state, seen = model.matgptq, []
    hooks = [
        m.register_forward_hook(lambda m, i, o, name=name: seen.append((name, i[0], o)))
        for name, m in model.named_modules()
        if isinstance(m, NestedLinear)
    ]
    try:
        with torch.no_grad():
            logits = model(ids.to(DEVICE)).logits
    finally:
        for h in hooks:
            h.remove()
    assert {name for name, _, _ in seen} == set(state.layers)
    for name, x, y in seen:
        check(y, x, state.layers[name], state.bits[name])
    return logits.cpu()


@pytest.mark.parametrize("resident", list(Resident))
def test_loaded_model_on_the_nested_kernels(kernels, parent, resident):
    model = nested_model(parent, 3, resident)
    layers = {n: model.get_submodule(n) for n in model.matgptq.layers}
    assert len(layers) == 14 and all(isinstance(m, NestedLinear) for m in layers.values())
    ptrs = {n: m.planes.data_ptr() for n, m in layers.items()}
    for bits in (3, 8, 4):
        matgptq.set_bits(model, bits)
        for name, m in ((n, model.get_submodule(n)) for n in layers):
            k32 = math.ceil(m.in_features / 32)
            if resident is Resident.PARENT:  # the same module and buffers: one integer changed
                assert m is layers[name] and m.planes.data_ptr() == ptrs[name] and m.bits == bits
            else:  # r planes: r bits per weight
                assert m.planes.numel() * 4 == bits * k32 * 4 * m.out_features and m.bits == bits
        logits = run_and_check(model, IDS)
        dense = matgptq.load(parent, bits=bits, packed=False)
        with torch.no_grad():
            assert torch.equal(logits.argmax(-1), dense(IDS).logits.argmax(-1))


@pytest.mark.filterwarnings("ignore:You passed `quantization_config`:UserWarning")
def test_from_pretrained_runs_the_nested_kernels(kernels, parent, monkeypatch):
    """transformers' from_pretrained(device_map="cuda") builds what load(device="cuda") builds: NestedLinear layers,
    everything on the device, each layer's output within its bound, the dense model's greedy tokens. In the
    interpreter the route's packing is forced to NESTED (on the CPU it would pack for the CPU's int4 kernel)."""
    from transformers import AutoModelForCausalLM

    from matgptq.integrations import transformers as route

    if DEVICE == "cpu":
        monkeypatch.setattr(route, "default_packing", lambda *a: Packing.NESTED)
    config = matgptq.MatGPTQQuantizationConfig(bits=3)
    model = AutoModelForCausalLM.from_pretrained(parent, device_map=DEVICE, quantization_config=config)
    ref = nested_model(parent, 3, Resident.SLICE)
    assert [type(m).__name__ for m in model.modules()] == [type(m).__name__ for m in ref.modules()]
    assert model.matgptq.packing is Packing.NESTED and not model.matgptq.dense
    assert all(t.device.type == DEVICE for t in (*model.parameters(), *model.buffers()))
    logits = run_and_check(model, IDS)
    with torch.no_grad():
        assert torch.equal(logits.argmax(-1), matgptq.load(parent, bits=3, packed=False)(IDS).logits.argmax(-1))


def test_decode_batch_and_generate(kernels, parent):
    """Batch-4 decode steps (the GEMV kernel) give the dense model's greedy tokens."""
    model = nested_model(parent, 4, "parent")
    ids = torch.tensor([[1, 20, 30], [1, 40, 50], [1, 60, 70], [1, 80, 90]])
    out = model.generate(ids.to(DEVICE), max_new_tokens=3, do_sample=False).cpu()
    dense = matgptq.load(parent, bits=4, packed=False)
    assert torch.equal(out, dense.generate(ids, max_new_tokens=3, do_sample=False))
    run_and_check(model, out[:, -1:])  # one decode step of 4 rows, layer by layer


def test_a_slice_holds_fewer_bytes_than_the_parent(kernels, parent):
    sizes = {r: weight_bytes(nested_model(parent, 3, r)) for r in Resident}
    assert sizes[Resident.SLICE] < sizes[Resident.PARENT] < weight_bytes(matgptq.load(parent, bits=3, packed=False))


def test_uneven_groups_run_dense_with_one_notice(kernels, parent, capsys):
    """act-order groups of unequal sizes (here one column moved from group 0 to group 1) have no nested layout: that
    layer keeps a dense weight, the others run nested, and one line says so; set_bits keeps it dense."""
    ckpt = read_checkpoint(parent)
    name = "model.layers.0.mlp.down_proj"
    q = ckpt.layers[name]
    g_idx = q.g_idx.clone()
    g_idx[int(torch.nonzero(g_idx == 0)[0])] = 1
    ckpt.layers[name] = replace(q, g_idx=g_idx)
    capsys.readouterr()
    model = build_model(ckpt, 3, packed=Packing.NESTED, device=DEVICE)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("matgptq: 1 of 14 quantized layers run dense") and "uneven" in err[0]
    assert list(model.matgptq.dense) == [name]
    kinds = {type(model.get_submodule(n)).__name__ for n in ckpt.layers if n != name}
    assert kinds == {"NestedLinear"} and isinstance(model.get_submodule(name), torch.nn.Linear)
    matgptq.set_bits(model, 8)
    assert torch.equal(model.get_submodule(name).weight.cpu(), ckpt.layers[name].dequantize())
    assert capsys.readouterr().err == ""


def test_without_triton_every_layer_runs_dense(parent, capsys, monkeypatch):
    import matgptq.runtime.state as state

    why = "the nested GPU kernels need Triton: pip install 'matgptq[kernels]'"
    monkeypatch.setattr(state, "kernels_missing", lambda: why)
    capsys.readouterr()
    model = build_model(read_checkpoint(parent), 3, packed=Packing.NESTED)
    err = capsys.readouterr().err
    assert err.startswith("matgptq: 14 of 14 quantized layers run dense") and err.endswith(f": {why}\n")
    assert err.count("\n") == 1
    dense = matgptq.load(parent, bits=3, packed=False)
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, dense(IDS).logits)


def test_packing_choices_and_bad_requests(parent):
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert default_packing(None, torch.float32, False, cuda) is Packing.NESTED
    assert default_packing(True, torch.bfloat16, False, cuda) is Packing.NESTED
    assert default_packing(False, torch.bfloat16, False, cuda) is Packing.DENSE
    assert default_packing(None, torch.float32, True, cuda) is Packing.DENSE  # Conv1D: no packed layer holds it
    assert default_packing(True, torch.float32, False, cpu) is Packing.CPU
    assert default_packing(None, torch.float32, False, cpu) is Packing.DENSE
    assert QuantizedState(read_checkpoint(parent), {}, True).packing is Packing.CPU  # the former `packed` flag
    for kw, match in [
        ({"resident": "gpu"}, "not a choice; use slice .* or parent"),
        ({"resident": "parent"}, "loads on the CPU"),
        ({"device": "tpu"}, "not a device"),
    ]:
        with pytest.raises(UserError, match=match) as e:
            matgptq.load(parent, **kw)
        assert "\n" not in str(e.value)
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="needs CUDA"):
            matgptq.load(parent, device="cuda")
    else:
        with pytest.raises(UserError, match="packed=False keeps dense weights"):
            matgptq.load(parent, device="cuda", packed=False, resident="slice")
    with pytest.raises(UserError, match="resident"):
        NestedLinear(random_parent(8, 32, 32, False), 3, None, torch.float32, "both")
    with pytest.raises(UserError, match="uneven groups"):
        NestedLinear(
            replace(random_parent(8, 64, 32, False), g_idx=torch.tensor([0] * 31 + [1] * 33)), 3, None, torch.float32
        )
