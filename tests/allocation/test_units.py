"""A tied search (allocation/units.py): units from the model's fused groups, costs counted exactly, tables of units
checked against the layer-wise scoring they stand for, and `matgptq search` writing mixes whose fused groups have
one width each (what vLLM needs to load them)."""

import itertools
import json
from fractions import Fraction

import pytest

from matgptq.allocation import BudgetKind, CostModel
from matgptq.allocation.allocators import error_table
from matgptq.allocation.fitness import Fitness
from matgptq.allocation.gradient import first_order_table
from matgptq.allocation.sensitivity import Sensitivity, measure, relative_errors
from matgptq.allocation.units import Units, label
from matgptq.cli import main
from matgptq.formats import read_checkpoint
from matgptq.models.fused import fused_groups, mixed_groups
from tests.allocation.test_cli import search
from tests.test_cli import run_error

LEVELS = (2, 4, 8)


def test_units_cover_every_layer_once_and_expand_a_mix():
    layers = ("a.q", "a.k", "a.v", "a.o", "b")
    units = Units.grouped(layers, [("a.q", "a.k", "a.v"), ("a.o",), ("b",)])
    assert units.members == ((0, 1, 2), (3,), (4,)) and units.tied
    assert units.names == ("a.{q,k,v}", "a.o", "b")
    assert units.expand((3, 4, 8)) == (3, 3, 3, 4, 8)
    assert units.widths((3, 4, 8)) == {"a.q": 3, "a.k": 3, "a.v": 3, "a.o": 4, "b": 8}
    assert not Units.each(layers).tied and Units.each(layers).expand((1, 2, 3, 4, 5)) == (1, 2, 3, 4, 5)
    with pytest.raises(ValueError, match="exactly once"):
        Units(layers, ((0, 1), (1, 2, 3, 4)))
    # a group member that is not quantized (absent from the layers) leaves its unit
    assert Units.grouped(("x.q", "x.o"), [("x.q", "x.k"), ("x.o",)]).members == ((0,), (1,))
    assert label([f"m.e.{i}.{p}" for i in range(2) for p in "gud"]) == "m.e.{6 layers}"


def test_sum_rows_adds_each_units_increments_over_the_base():
    units = Units.grouped(("q", "k", "o"), [("q", "k"), ("o",)])
    rows = [[5.0, 2.0, 1.0], [4.0, 1.5, 1.0], [None, 3.0, 1.0]]
    # by hand: b + (v_q - b) + (v_k - b) with b = 1
    assert units.sum_rows(rows, base=1.0) == [[8.0, 2.5, 1.0], [None, 3.0, 1.0]]
    assert units.sum_rows(rows) == [[9.0, 3.5, 2.0], [None, 3.0, 1.0]]


@pytest.mark.parametrize("kind", [BudgetKind.CODE, BudgetKind.STORAGE])
def test_a_tied_cost_model_counts_every_mix_as_the_layers_do(grouped_parent, kind):
    ckpt = read_checkpoint(grouped_parent)
    names = tuple(ckpt.layers)
    units = Units.grouped(names, fused_groups(ckpt.config, names))
    layerwise = CostModel.from_checkpoint(ckpt, LEVELS)
    tied = layerwise.grouped(units)
    assert len(tied.layers) < len(layerwise.layers) and tied.total_weights == layerwise.total_weights
    for mix in itertools.islice(itertools.product(LEVELS, repeat=len(units.members)), 0, None, 97):
        assert tied.cost(mix, kind) == layerwise.cost(units.expand(mix), kind)
    assert tied.limit(Fraction(3), kind) == layerwise.limit(Fraction(3), kind)


@pytest.fixture(scope="module")
def both(stories_fitness):
    """The stories fitness and a tied one on the same model, teacher and windows."""
    f = stories_fitness
    units = Units.grouped(f.names, fused_groups(f.model.config, f.names))
    assert units.tied
    return f, Fitness(f.model, f.teacher, f.windows, f.names, f.batch_size, units=units)


def test_a_tied_table_scores_each_unit_lowered_as_a_whole(both):
    layerwise, tied = both
    windows = (0, 1)
    table = measure(tied, LEVELS, windows, Sensitivity.FULL)
    top = tuple(8 for _ in layerwise.names)
    for u, unit in enumerate(tied.units.members):  # the oracle: the layer-wise fitness with the unit's layers lowered
        for i, r in enumerate(LEVELS[:-1]):
            expanded = tuple(r if k in unit else 8 for k in range(len(top)))
            assert table[u][i] == pytest.approx(layerwise.kl(expanded, windows), rel=1e-9, abs=1e-12)


def test_tied_error_and_gradient_tables_add_their_layers_terms(both):
    layerwise, tied = both
    windows = (0, 1)
    makers = {
        "error": lambda f: error_table(f, LEVELS, windows),
        "gradient": lambda f: first_order_table(f, LEVELS, windows, 4),
    }
    for name, make in makers.items():
        rows, units = make(layerwise), make(tied)
        base = rows[0][LEVELS.index(4)] if name == "gradient" else 0.0  # gradient: F(u), every row's value at u
        for u, unit in enumerate(tied.units.members):
            for i in range(len(LEVELS)):
                got = [rows[k][i] for k in unit]
                if None in got:
                    assert units[u][i] is None, name
                else:
                    assert units[u][i] == pytest.approx(base + sum(v - base for v in got), rel=1e-9, abs=1e-15), name


def test_a_units_relative_error_is_its_summed_error_over_its_summed_norm(both):
    layerwise, tied = both
    layers = layerwise.model.matgptq.layers
    errors = relative_errors(tied, LEVELS)
    for u, unit in enumerate(tied.units.members):
        norms = [float(layers[layerwise.names[k]].slice(8).dequantize().double().square().sum()) for k in unit]
        per = relative_errors(layerwise, LEVELS)
        want = [sum(per[k][i] * n for k, n in zip(unit, norms)) / sum(norms) for i in range(len(LEVELS))]
        assert errors[u] == pytest.approx(want, rel=1e-9)


def _tied_everywhere(body: dict, groups) -> None:
    for key in ("bits", "dp_bits", "start_bits", "search_bits"):
        assert mixed_groups(groups, body[key]) == [], key
    for name, widths in body["baseline_bits"].items():
        assert mixed_groups(groups, widths) == [], name


def test_search_ties_the_fused_groups_and_keeps_the_budget(stories_parent, tmp_path, capsys):
    ckpt = read_checkpoint(stories_parent)
    names = tuple(ckpt.layers)
    groups = [g for g in fused_groups(ckpt.config, names) if len(g) > 1]
    assert {tuple(n.rpartition(".")[2] for n in g) for g in groups} == {
        ("q_proj", "k_proj", "v_proj"),
        ("gate_proj", "up_proj"),
    }
    assert main(search(stories_parent, tmp_path / "tied", "--budget", "3.0,2.5", "--tie")) == 0
    assert "tied: each of the 10 groups" in capsys.readouterr().out  # stories260K: 5 blocks × (q/k/v, gate/up)
    cost = CostModel.from_checkpoint(ckpt, LEVELS)
    for budget in ("3.0", "2.5"):
        body = json.loads((tmp_path / "tied" / f"mix-{budget}.json").read_text())
        _tied_everywhere(body, groups)
        assert sorted(map(tuple, body["tied"])) == sorted(groups) and body["settings"]["tie"] is True
        assert cost.fits(tuple(body["bits"][n] for n in names), Fraction(budget), BudgetKind.CODE)
        assert body["summary"]["tied_groups"] == len(groups)
    # the untied search of the same budget is the layer-wise one, and says so
    assert main(search(stories_parent, tmp_path / "untied", "--budget", "2.5", "--no-tie")) == 0
    assert "untied: each layer chose" in capsys.readouterr().out
    body = json.loads((tmp_path / "untied" / "mix-2.5.json").read_text())
    assert body["tied"] == [] and body["settings"]["tie"] is False
    # a resume with the other tie refuses the state rather than mixing two searches
    err = run_error(search(stories_parent, tmp_path / "untied", "--budget", "2.5", "--resume", "--tie"), capsys)
    assert "other settings (tie)" in err, err


def test_noise_has_no_tied_form(stories_parent, tmp_path, capsys):
    err = run_error(search(stories_parent, tmp_path / "n", "--budget", "3.0", "--baselines", "noise", "--tie"), capsys)
    assert "--no-tie" in err and not (tmp_path / "n").exists()
