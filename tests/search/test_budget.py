"""Bit counts of a mix: storage bits equal the bytes a sliced checkpoint really holds; budgets are checked exactly."""

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from matgptq.errors import UserError
from matgptq.formats import read_checkpoint, save_checkpoint
from matgptq.search.budget import BudgetKind, CostModel, LayerSize, parse_budget
from matgptq.untrusted import read_header

BYTES = {"U8": 1, "F16": 2, "I32": 4}


@pytest.mark.parametrize("parent_name", ["grouped_parent", "stories_parent"])
def test_storage_bits_are_the_bytes_of_a_sliced_checkpoint(parent_name, request, tmp_path):
    """Oracle: the safetensors header of a checkpoint written by `save_checkpoint` at each width."""
    ckpt = read_checkpoint(request.getfixturevalue(parent_name))
    model = CostModel.from_checkpoint(ckpt, (2, 3, 5, 8))
    for r in model.levels:
        out = save_checkpoint(tmp_path / f"s{r}", ckpt.config, {}, {n: q.slice(r) for n, q in ckpt.layers.items()},
                              {}, None)  # fmt: skip
        header = read_header(out / "model.safetensors")
        for layer in model.layers:
            held = sum(BYTES[dt] * _numel(shape) for key, (dt, shape) in header.items()
                       if key.rpartition(".")[0] == layer.name)  # fmt: skip
            assert layer.bits(r, BudgetKind.STORAGE) == 8 * held, (layer.name, r)
            assert layer.bits(r, BudgetKind.CODE) == layer.rows * layer.cols * r


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
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40), st.integers(1, 4)), min_size=1, max_size=6),
       st.lists(st.integers(2, 8), min_size=1, max_size=5, unique=True))  # fmt: skip
def test_storage_never_below_code_bits(shapes, levels):
    m = CostModel(tuple(LayerSize(f"l{i}", n, k, g) for i, (n, k, g) in enumerate(shapes)), tuple(sorted(levels)))
    for layer in m.layers:
        for r in m.levels:
            assert layer.bits(r, BudgetKind.STORAGE) >= layer.bits(r, BudgetKind.CODE)
