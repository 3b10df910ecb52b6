"""Bit counts of a mix: storage bits equal the bytes a sliced checkpoint really holds; budgets are checked exactly."""

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from matgptq.allocation.budget import BudgetKind, CostModel, LayerSize, parse_budget
from matgptq.errors import UserError
from matgptq.formats import read_checkpoint, save_checkpoint
from matgptq.untrusted import read_header

BYTES = {"U8": 1, "F16": 2, "I32": 4}


@pytest.mark.parametrize("parent_name", ["grouped_parent", "stories_parent"])
def test_storage_bits_are_the_bytes_of_a_sliced_checkpoint(parent_name, request, tmp_path):
    """Oracle: the safetensors header of a checkpoint written by `save_checkpoint` at each width."""
    ckpt = read_checkpoint(request.getfixturevalue(parent_name))
    model = CostModel.from_checkpoint(ckpt, (2, 3, 5, 8))
    for r in model.levels:
        out = save_checkpoint(
            tmp_path / f"s{r}", ckpt.config, {}, {n: q.slice(r) for n, q in ckpt.layers.items()}, {}, None
        )
        header = read_header(out / "model.safetensors")
        for layer in model.layers:
            held = sum(
                BYTES[dt] * _numel(shape) for key, (dt, shape) in header.items() if key.rpartition(".")[0] == layer.name
            )
            assert layer.bits(r, BudgetKind.STORAGE) == 8 * held, (layer.name, r)
            assert layer.bits(r, BudgetKind.CODE) == layer.rows * layer.cols * r


@pytest.fixture(scope="module")
def lattice_parent(tmp_path_factory):
    """A MatGPTQ [4,5,6,8] parent, group 32, scales on Q4_K's lattice, with 256-wide rows: its 6-bit slice is Q6_K."""
    from tests.conftest import make_tiny_llama, quick_quantize

    root = tmp_path_factory.mktemp("lattice")
    model = make_tiny_llama(root / "k256", hidden=256, intermediate=256, heads=4, kv_heads=2, layers=1)
    return quick_quantize(model, root / "parent", method="matgptq", bits="4,5,6,8", group_size=32, kquant="q4_k")


@pytest.mark.parametrize("parent_name", ["grouped_parent", "stories_parent", "lattice_parent"])
def test_gguf_bits_are_the_tensor_bytes_gguf_py_reads_back(parent_name, request, tmp_path):
    """Oracle: gguf-py's GGUFReader on the file `matgptq export --format gguf --bits-config MIX` writes: the layers'
    tensors hold exactly the mix's GGUF cost in bytes. The mixes give every layer each level in turn, so every
    (layer, level) cost enters one sum; the parents cover codes-keeping types (Q4_0/Q5_0/Q6_K/Q8_0), the Q8_0
    re-quantization of act-order groups (grouped_parent) and the float fallback of 172-wide rows (stories260K)."""
    import json

    from gguf import GGUFReader

    from matgptq.cli import main

    parent = request.getfixturevalue(parent_name)
    ckpt = read_checkpoint(parent)
    levels = (2, 3, 4, 5, 6, 8) if parent_name != "lattice_parent" else (4, 5, 6, 8)
    model = CostModel.from_checkpoint(ckpt, levels, gguf=True)
    seen_types = set()
    for shift in range(len(levels)):
        mix = tuple(levels[(i + shift) % len(levels)] for i in range(len(model.layers)))
        (tmp_path / "mix.json").write_text(json.dumps({"bits": dict(zip(model.names, mix))}))
        out = tmp_path / f"m{shift}.gguf"
        assert (
            main(
                [
                    "export",
                    str(parent),
                    "--format",
                    "gguf",
                    "--bits-config",
                    str(tmp_path / "mix.json"),
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
        tensors = [t for t in GGUFReader(out).tensors if t.name.startswith("blk.") and "norm" not in t.name]
        assert len(tensors) == len(model.layers)
        assert 8 * sum(int(t.n_bytes) for t in tensors) == model.cost(mix, BudgetKind.GGUF)
        seen_types |= {t.tensor_type.name for t in tensors}
    want = {
        "grouped_parent": {"Q8_0"},
        "stories_parent": {"Q4_0", "Q5_0", "Q8_0", "F32"},
        "lattice_parent": {"Q4_0", "Q5_0", "Q6_K", "Q8_0"},
    }[parent_name]
    assert want <= seen_types, seen_types


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def test_budget_is_the_exact_decimal():
    assert parse_budget("2.5") == Fraction(5, 2) and parse_budget(3) == 3
    assert parse_budget("0.1") == Fraction(1, 10)  # not the float 0.1000000000000000055…
    for bad in ("x", "-1", "0"):
        with pytest.raises(UserError):
            parse_budget(bad)


def test_limit_and_fits_on_a_hand_example():
    m = CostModel((LayerSize("a", 2, 3, 1), LayerSize("b", 4, 5, 1)), (2, 3, 4))  # 6 + 20 = 26 weights
    assert m.limit(Fraction(5, 2), BudgetKind.CODE) == 65  # 2.5 · 26
    assert m.fits((4, 2), Fraction(5, 2), BudgetKind.CODE)  # 24 + 40 = 64
    assert not m.fits((3, 3), Fraction(5, 2), BudgetKind.CODE)  # 78
    assert m.average((4, 2), BudgetKind.CODE) == 64 / 26


def test_budgets_outside_the_levels_are_refused():
    m = CostModel((LayerSize("a", 8, 8, 1),), (2, 4, 8))
    m.check_budget(Fraction(2), BudgetKind.CODE)
    m.check_budget(Fraction(8), BudgetKind.CODE)
    with pytest.raises(UserError, match="below what the lowest level 2"):
        m.check_budget(Fraction(19, 10), BudgetKind.CODE)
    with pytest.raises(UserError, match="above what the highest level 8"):
        m.check_budget(Fraction(81, 10), BudgetKind.CODE)
    # storage: 8·8·2 code bits + 8·24 scale/zero bits + 8·32 g_idx bits = 576 over 64 weights = 9 bits at 2 bits
    with pytest.raises(UserError, match="below"):
        m.check_budget(Fraction(3), BudgetKind.STORAGE)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40), st.integers(1, 4)), min_size=1, max_size=6),
    st.lists(st.integers(2, 8), min_size=1, max_size=5, unique=True),
)
def test_storage_never_below_code_bits(shapes, levels):
    m = CostModel(tuple(LayerSize(f"l{i}", n, k, g) for i, (n, k, g) in enumerate(shapes)), tuple(sorted(levels)))
    for layer in m.layers:
        for r in m.levels:
            assert layer.bits(r, BudgetKind.STORAGE) >= layer.bits(r, BudgetKind.CODE)
