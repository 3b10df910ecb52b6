"""GRADIENT: a one-shot allocation from one backward pass at the uniform slice under the budget (first order).

Let u be the widest uniform width within a budget (allocators.uniform_mix) and F the fitness (fitness.py). Moving
layer l alone from u to width r changes F, to first order, by

    F(u with layer l at r) − F(u) ≈ ⟨∂F/∂W_l, W_l(r) − W_l(u)⟩,    ∂F/∂W_l = (1/N) Σ_t g_t x_tᵀ

x_t: layer l's input at position t, g_t = ∂(N·F)/∂y_t the gradient at its output y_t = W_l x_t (+ b), N the
predicted positions of the windows. One forward and backward pass of the uniform slice gives ∂F/∂W_l for every
layer, and the parent's slices give W_l(r) for every width: a table for every layer and width for a few scorings'
compute plus dequantizing the slices, where the probe table (sensitivity.py) scores once per layer.

Only raising a layer above the floor is predicted (r ≥ u), and the mix is the knapsack over those widths
(`floor_mix`). The uniform slice is not an optimum of F, so the first-order term is the leading one, and it is a
good guide where a layer's error shrinks; where it grows (r < u) F is convex in the error and a linear term
misjudges it, even in sign. For the same reason the table is only as good as the uniform slice is close to the
teacher: around a slice that has lost the model (a 2-bit one, say) a first-order step says little. The search
scores this mix against its other starts (choice.first_parent), so a poor one costs a scoring, not the result.

At a budget whose uniform slice leaves no room to raise a layer (most integer budgets), the mix is the uniform slice
and no pass is made (allocators.raise_floors).

Memory: the backward pass goes one decoder block at a time (`_BlockPass`). A forward pass without a graph keeps
each block's input; the head's gradient comes from the last block's output; then each block, last to first, is run
again with a graph from its kept input and differentiated, and the ∂F/∂W_l of its layers are folded into their
table rows (⟨∂F/∂W_l, W_l(r) − W_l(u)⟩ for every r) and dropped. So the pass holds one batch's block inputs, one
block's graph and one block's gradients, not the whole model's graph and one gradient per layer (which raised
the peak memory of SmolLM2-135M's 10-minute search: docs/decisions/code-constants.md). Every batch
of windows is folded in this way, so a slice is dequantized once per batch. The pass computes in float32 whatever
`compute_dtype` the fitness scores in; the extra forward pass without a graph makes it about four scorings' compute.
"""

from __future__ import annotations

import torch

from ..models import layer_weight
from ..models.experts import experts_as_layers
from .budget import BudgetKind, CostModel
from .fitness import Fitness, Mix, Replay
from .knapsack import solve
from .spread import from_rank0

FloorTables = dict[int, list[list[float | None]]]  # {floor u: v[l][i] = predicted F at levels[i], None below u}


def _hidden_of(output) -> torch.Tensor:
    """A block's output hidden states (transformers' blocks return them alone or first in a tuple)."""
    return output[0] if isinstance(output, (tuple, list)) else output


def _with_hidden(args: tuple, kwargs: dict, hidden: torch.Tensor) -> tuple[tuple, dict]:
    """A block call's arguments with its hidden states replaced (passed first, or as `hidden_states`)."""
    if args:
        return (hidden, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": hidden}


class _BlockPass:
    """One batch's forward and block-by-block backward pass (module docstring); `fold` receives each layer's
    Σ_t g_t x_tᵀ as soon as its block is differentiated."""

    def __init__(self, fitness: Fitness, fold) -> None:
        self.fitness, self.fold = fitness, fold
        self.grads: dict[int, torch.Tensor] = {}

    def layer_hook(self, i: int):
        def record(module, args, output):
            if not output.requires_grad:  # the forward without a graph
                return
            x = args[0].detach()

            def accumulate(g):
                gx = g.reshape(-1, g.shape[-1]).float().T @ x.reshape(-1, x.shape[-1]).float()
                self.grads[i] = gx if i not in self.grads else self.grads[i].add_(gx)

            output.register_hook(accumulate)

        return record

    def drain(self) -> None:
        for i in list(self.grads):
            self.fold(i, self.grads.pop(i))

    def run(self, batch: list[int]) -> tuple[float, int]:
        """(N·F, N) of `batch`, every layer's gradient folded."""
        fitness, blocks = self.fitness, self.fitness.blocks
        ids = fitness.windows[batch].to(fitness.device)
        calls, last = [], []
        handles = [b.register_forward_pre_hook(lambda m, a, k: calls.append((a, k)), with_kwargs=True) for b in blocks]
        handles.append(blocks[-1].register_forward_hook(lambda m, a, o: last.append(o)))
        try:
            with torch.no_grad():
                fitness.body(ids)
        finally:
            for h in handles:
                h.remove()
        out = _hidden_of(last[0]).detach().requires_grad_()
        replayed = (out, *last[0][1:]) if isinstance(last[0], (tuple, list)) else out
        saved = list(blocks)
        for b in range(len(blocks)):  # every block replays the last one's output: only the final norm runs
            blocks[b] = Replay(replayed)
        try:
            with torch.enable_grad():
                final = fitness.body(ids)[:, :-1].reshape(-1, fitness.body.hidden_size).to(fitness.head.weight.dtype)
                leaf = final.detach().requires_grad_()
                total = 0.0
                for _, kl in fitness.chunk_kls(batch, leaf):  # chunk by chunk, the gradient accumulating in leaf.grad
                    kl.backward()
                    total += float(kl.detach())
                final.backward(leaf.grad)
        finally:
            for b, block in enumerate(saved):
                blocks[b] = block
        self.drain()  # a layer outside the blocks (none in the architectures we know) is reached by now
        grad = out.grad
        for b in reversed(range(len(blocks))):
            args, kwargs = calls[b]
            calls[b] = None
            x = _hidden_of(args or (kwargs["hidden_states"],)).detach().requires_grad_()
            args, kwargs = _with_hidden(args, kwargs, x)
            with torch.enable_grad():
                _hidden_of(blocks[b](*args, **kwargs)).backward(grad)
            grad = x.grad
            self.drain()
        return total, leaf.shape[0]


@torch.no_grad()
def first_order_table(
    fitness: Fitness, levels: tuple[int, ...], windows: tuple[int, ...], floor: int
) -> list[list[float | None]]:
    """v[l][i] = F(u) + ⟨∂F/∂W_l, W_l(levels[i]) − W_l(u)⟩ at the uniform mix u = `floor` (None below it), for
    every unit l of `fitness.units` (a unit's layers' terms added: units.py)."""
    fitness.apply(fitness.uniform(floor))
    layers, above = fitness.model.matgptq.layers, [r for r in levels if r > floor]
    moved = [[0.0] * len(above) for _ in fitness.names]  # Σ over positions of ⟨g xᵀ, W_l(r) − W_l(u)⟩

    def fold(i: int, gx: torch.Tensor) -> None:
        name = fitness.names[i]
        at_floor = layer_weight(fitness.model, name, fitness.spec).float()  # the model holds the floor's slice
        for j, r in enumerate(above):
            step = layers[name].slice(r).dequantize(torch.float32) - at_floor  # on the model's device (Fitness)
            moved[i][j] += float((gx * step).sum(dtype=torch.float64))

    total, count = 0.0, 0
    trainable = [p for p in fitness.model.parameters() if p.requires_grad]
    with experts_as_layers(fitness.blocks, fitness.spec.experts):  # fused experts: each sees its routed tokens
        block_pass = _BlockPass(fitness, fold)
        handles = [
            fitness.model.get_submodule(n).register_forward_hook(block_pass.layer_hook(i))
            for i, n in enumerate(fitness.names)
        ]
        try:
            for p in trainable:  # no parameter's gradient is wanted (the head's alone is vocabulary × H)
                p.requires_grad_(False)
            for batch in fitness.batches(windows):
                t, n = block_pass.run(batch)
                total, count = total + t, count + n
        finally:
            for p in trainable:
                p.requires_grad_(True)
            for h in handles:
                h.remove()
    base = total / count
    # a layer no token reached (an expert the router never chose) has no gradient: it moves F by nothing
    table = [
        [None if r < floor else base if r == floor else base + moved[i][above.index(r)] / count for r in levels]
        for i in range(len(fitness.names))
    ]
    # under torchrun every rank runs the pass; all allocate from rank 0's table
    return from_rank0(fitness.units.sum_rows(table, base))


def floor_mix(cost_model: CostModel, table: list[list[float | None]], budget, kind: BudgetKind, floor: int) -> Mix:
    """The mix minimising Σ_l v_l(r_l) under the budget over the widths r_l ≥ `floor` (knapsack.py)."""
    cols = [i for i, r in enumerate(cost_model.levels) if r >= floor]
    costs = cost_model.table(kind)
    solution = solve(
        [[row[i] for i in cols] for row in costs],
        [[row[i] for i in cols] for row in table],
        cost_model.limit(budget, kind),
    )
    if solution is None:  # the uniform floor fits by construction (uniform_mix)
        raise ValueError(f"the uniform {floor}-bit mix does not fit the budget")
    return tuple(cost_model.levels[cols[j]] for j in solution.choice)
