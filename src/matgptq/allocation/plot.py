"""Why the search chose what it chose: per layer, the written width against the measured cost of lowering it.

`series(mix)` reads a mix file's `bits` and `sensitivity` (the knapsack start's table, record.py): for each layer in
the file's order, its width and Δ_l = s_l(lowest) − s_l(top), the KL the start's table predicts the layer would add at
the lowest width. `plot_mix` draws them (`matgptq search --plot`): bars for the widths, Δ on a log axis beside them,
so layers the search kept wide should be the ones whose Δ is high. Needs matplotlib (`pip install 'matgptq[plot]'`).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import UserError
from ..fsutil import atomic_output


def require_matplotlib() -> None:
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise UserError(
            "--plot draws with matplotlib, which is not installed; pip install 'matgptq[plot]' or leave out --plot"
        )


def series(mix: dict) -> tuple[list[str], list[int], list[float]]:
    """(layer names, written widths, Δ = predicted KL at the lowest width − at the top) in the file's layer order."""
    names = list(mix["bits"])
    table = mix["sensitivity"]
    levels = sorted(int(r) for r in next(iter(table.values())))
    lo, top = str(levels[0]), str(levels[-1])
    return names, [mix["bits"][n] for n in names], [table[n][lo] - table[n][top] for n in names]


def plot_mix(mix_file: Path, out: Path) -> None:
    """Draw `series` of the mix file into the PNG `out` (written atomically)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mix = json.loads(Path(mix_file).read_text(encoding="utf-8"))
    names, widths, delta = series(mix)
    x = range(len(names))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.12 * len(names)), 3.6))
    bars = ax.bar(x, widths, color="#9ecae1", label="written width")
    ax.set_ylabel("bits")
    ax.set_xlabel("layer (in the parent's order; blocks left to right)")
    ax2 = ax.twinx()
    (dots,) = ax2.plot(
        x, [max(d, 1e-9) for d in delta], "o", ms=3, color="#d62728", label="predicted ΔKL at the lowest width"
    )
    ax2.set_yscale("log")
    ax2.set_ylabel("predicted ΔKL at the lowest width")
    s = mix.get("summary", {})
    ax.set_title(
        f"budget {s.get('budget', '?')}: {s.get('code_bits', 0):.3f} code bits, chosen: {s.get('chosen', '?')}"
    )
    ax.legend(handles=[bars, dots], loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=8, frameon=False)
    fig.tight_layout()
    with atomic_output(Path(out), overwrite=True, directory=False) as f:
        fig.savefig(f, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
