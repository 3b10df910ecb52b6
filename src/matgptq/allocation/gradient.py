"""GRADIENT: a one-shot allocation from one backward pass at the uniform slice under the budget (first order).

Let u be the widest uniform width within a budget (allocators.uniform_mix) and F the fitness (fitness.py). Moving
layer l alone from u to width r changes F, to first order, by

    F(u with layer l at r) − F(u) ≈ ⟨∂F/∂W_l, W_l(r) − W_l(u)⟩,    ∂F/∂W_l = (1/N) Σ_t g_t x_tᵀ

x_t: layer l's input at position t, g_t = ∂(N·F)/∂y_t the gradient at its output y_t = W_l x_t (+ b), N the
predicted positions of the windows. One forward and backward pass of the uniform slice gives ∂F/∂W_l for every
layer, and the parent's slices give W_l(r) for every width: a table for every layer and width for about three
scorings' compute plus dequantizing the slices, where the probe table (sensitivity.py) scores once per layer.

Only raising a layer above the floor is predicted (r ≥ u), and the mix is the knapsack over those widths
(`floor_mix`). The uniform slice is not an optimum of F, so the first-order term is the leading one, and it is a
good guide where a layer's error shrinks; where it grows (r < u) F is convex in the error and a linear term
misjudges it, even in sign. For the same reason the table is only as good as the uniform slice is close to the
teacher: around a slice that has lost the model (a 2-bit one, say) a first-order step says little. The search
scores this mix against its other starts (runner._start), so a poor one costs a scoring, not the result.

At a budget whose uniform slice leaves no room to raise a layer (most integer budgets), the mix is the uniform slice
and no pass is made (allocators.raise_floors). The pass computes in float32 whatever `compute_dtype` the fitness
scores in, and holds one float32 gradient per quantized layer (the layers' size again) plus one window's activations
for the backward pass: on SmolLM2-135M (256-token windows) the search's peak memory grows by about 1.3 GB
(docs/results/search_minutes.md), which is why it is not a default baseline.
"""

from __future__ import annotations

import torch

from ..models import layer_weight
from ..models.experts import experts_as_layers
from .budget import BudgetKind, CostModel
from .fitness import Fitness, Mix, WindowTerms
from .knapsack import solve
from .spread import from_rank0

FloorTables = dict[int, list[list[float | None]]]  # {floor u: v[l][i] = predicted F at levels[i], None below u}


def _loss(fitness: Fitness, window: int, hidden: torch.Tensor) -> torch.Tensor:
    """N·F of one window as a differentiable tensor: the KL rows of fitness.py's formula, summed."""
    if fitness.head.softcap is not None:  # a head that is not affine: the KL from both distributions
        logp = fitness.teacher.logprobs(fitness.teacher.hidden(window, window + 1)).to(hidden.device)
        return (logp.exp() * (logp - torch.log_softmax(fitness.head(hidden).float(), -1))).sum(dtype=torch.float64)
    terms: WindowTerms = fitness.window_terms(window)
    lse = torch.logsumexp(fitness.head(hidden).float(), -1).double()
    return (terms.const - (hidden.double() * terms.g).sum(-1) + lse * terms.mass).sum()


def gradients(fitness: Fitness, mix: Mix, windows: tuple[int, ...]) -> tuple[float, list[torch.Tensor]]:
    """(F(mix; windows), [∂F/∂W_l as [out, in] float32 for every layer of `fitness.names`]), one window at a time."""
    fitness.apply(mix)
    grads: list[torch.Tensor | None] = [None] * len(fitness.names)

    def hook(i):
        def record(module, args, output):
            x = args[0].detach()

            def accumulate(g):
                gx = g.reshape(-1, g.shape[-1]).float().T @ x.reshape(-1, x.shape[-1]).float()
                grads[i] = gx if grads[i] is None else grads[i].add_(gx)

            output.register_hook(accumulate)

        return record

    def track(module, args, output):  # no weight needs a gradient: the graph starts at the embeddings
        return output.detach().requires_grad_()

    total, count = 0.0, 0
    with experts_as_layers(fitness.blocks, fitness.spec.experts):  # fused experts: each sees its routed tokens
        handles = [fitness.model.get_submodule(n).register_forward_hook(hook(i)) for i, n in enumerate(fitness.names)]
        handles.append(fitness.model.get_input_embeddings().register_forward_hook(track))
        try:
            with torch.enable_grad():
                for w in windows:
                    ids = fitness.windows[w : w + 1].to(fitness.device)
                    hidden = fitness.body(ids)[:, :-1].reshape(-1, fitness.body.hidden_size).to(fitness.head.weight.dtype)
                    loss = _loss(fitness, w, hidden)
                    loss.backward()
                    total, count = total + float(loss.detach()), count + hidden.shape[0]
        finally:
            for h in handles:
                h.remove()
    shapes = [(fitness.model.matgptq.layers[n].shape) for n in fitness.names]
    # a layer no token reached (an expert the router never chose) has no gradient: it moves F by nothing
    return total / count, [torch.zeros(s) if g is None else g / count for g, s in zip(grads, shapes)]


@torch.no_grad()
def first_order_table(fitness: Fitness, levels: tuple[int, ...], windows: tuple[int, ...],
                      floor: int) -> list[list[float | None]]:  # fmt: skip
    """v[l][i] = F(u) + ⟨∂F/∂W_l, W_l(levels[i]) − W_l(u)⟩ at the uniform mix u = `floor` (None below it)."""
    base, grads = gradients(fitness, tuple(floor for _ in fitness.names), windows)
    layers = fitness.model.matgptq.layers
    table = []
    for name, g in zip(fitness.names, grads):
        at_floor = layer_weight(fitness.model, name, fitness.spec).float()  # the model holds the floor's slice now
        def moved(r: int) -> float:
            return float((g * (layers[name].slice(r).dequantize(torch.float32) - at_floor)).sum(dtype=torch.float64))

        table.append([None if r < floor else base if r == floor else base + moved(r) for r in levels])
    return from_rank0(table)  # under torchrun every rank runs the pass; all allocate from rank 0's table


def floor_mix(cost_model: CostModel, table: list[list[float | None]], budget, kind: BudgetKind, floor: int) -> Mix:
    """The mix minimising Σ_l v_l(r_l) under the budget over the widths r_l ≥ `floor` (knapsack.py)."""
    cols = [i for i, r in enumerate(cost_model.levels) if r >= floor]
    costs = cost_model.table(kind)
    solution = solve([[row[i] for i in cols] for row in costs], [[row[i] for i in cols] for row in table],
                     cost_model.limit(budget, kind))  # fmt: skip
    if solution is None:  # the uniform floor fits by construction (uniform_mix)
        raise ValueError(f"the uniform {floor}-bit mix does not fit the budget")
    return tuple(cost_model.levels[cols[j]] for j in solution.choice)
