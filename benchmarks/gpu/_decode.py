"""Decode tokens/s of a Llama-3.1-8B-shaped model (random weights, BLOCKS decoder blocks of the real shapes, the real
vocabulary) with fp16 Linears against the nested runtime's layers (runtime/nested.py: one slice's planes, or the
whole parent resident); a part of `make gpu-check` (benchmarks/gpu/check.py), which calls `measure(tiny)`.

The model is written here in plain torch (RMSNorm, rotary attention over a static KV cache, SwiGLU MLP; embedding
and lm_head stay fp16 in every variant) so that one decode step, the next token's argmax included, is captured as a
CUDA graph: the time is the GPU's, not Python's. Tokens/s = batch / (seconds per step), the median of
_kernels.REPEATS runs of STEPS replayed steps; per block = (step − the same step with no blocks) / BLOCKS.
The weights of a quantized variant are a random 8-bit parent (group size 128) sliced to r bits, so every variant does the same arithmetic as a
real checkpoint's.

tiny=True (no CUDA): the same code with tiny shapes on the CPU, nested layers in Triton's interpreter, one step.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.gpu._kernels import graph_us
from matgptq.formats import QuantizedWeight
from matgptq.runtime.nested import NestedLinear, Resident

SHAPE = dict(hidden=4096, intermediate=14336, heads=32, kv_heads=8, head_dim=128, vocab=128256)
TINY = dict(hidden=256, intermediate=512, heads=4, kv_heads=2, head_dim=64, vocab=512)
BLOCKS, CACHE, STEPS, GROUP = 4, 1024, 32, 128


def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    v = x.float()
    return (v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * w


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-b, a], dim=-1) * sin


class Block(nn.Module):
    def __init__(self, s: dict, linear) -> None:
        super().__init__()
        d, q, kv = s["hidden"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
        self.s = s
        self.q, self.k, self.v, self.o = linear(q, d), linear(kv, d), linear(kv, d), linear(d, q)
        self.gate, self.up, self.down = (
            linear(s["intermediate"], d),
            linear(s["intermediate"], d),
            linear(d, s["intermediate"]),
        )
        self.register_buffer("n1", torch.ones(d, dtype=torch.float16))
        self.register_buffer("n2", torch.ones(d, dtype=torch.float16))

    def forward(self, h, pos, mask, cos, sin, kc, vc):
        b, s = h.shape[0], self.s
        x = rms(h, self.n1)
        q = self.q(x).view(b, 1, s["heads"], s["head_dim"]).transpose(1, 2)
        k = self.k(x).view(b, 1, s["kv_heads"], s["head_dim"]).transpose(1, 2)
        v = self.v(x).view(b, 1, s["kv_heads"], s["head_dim"]).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        kc.index_copy_(2, pos, k)
        vc.index_copy_(2, pos, v)
        a = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, enable_gqa=True)
        h = h + self.o(a.transpose(1, 2).reshape(b, 1, -1))
        x = rms(h, self.n2)
        return h + self.down(F.silu(self.gate(x)) * self.up(x))


class Decoder(nn.Module):
    """One decode step: token ids [B, 1] at position pos → next token ids (argmax), all on the device."""

    def __init__(self, s: dict, blocks: int, linear, batch: int, device: str) -> None:
        super().__init__()
        self.embed = nn.Embedding(s["vocab"], s["hidden"], device=device, dtype=torch.float16)
        self.blocks = nn.ModuleList(Block(s, linear) for _ in range(blocks))
        self.head = nn.Linear(s["hidden"], s["vocab"], bias=False, device=device, dtype=torch.float16)
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.head.weight, std=0.02)
        self.to(device)
        kv = (batch, s["kv_heads"], CACHE, s["head_dim"])
        self.caches = [
            (torch.zeros(kv, dtype=torch.float16, device=device), torch.zeros(kv, dtype=torch.float16, device=device))
            for _ in range(blocks)
        ]
        inv = 1.0 / (500000.0 ** (torch.arange(0, s["head_dim"], 2, device=device).float() / s["head_dim"]))
        ang = torch.arange(CACHE, device=device).float()[:, None] * inv[None, :]
        self.cos, self.sin = torch.cat([ang.cos()] * 2, -1).half(), torch.cat([ang.sin()] * 2, -1).half()
        self.ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)

    @torch.no_grad()
    def step(self) -> None:
        h = self.embed(self.ids)
        mask = (torch.arange(CACHE, device=h.device) <= self.pos)[None, None, None, :]
        cos, sin = self.cos[self.pos], self.sin[self.pos]
        for blk, (kc, vc) in zip(self.blocks, self.caches):
            h = blk(h, self.pos, mask, cos, sin, kc, vc)
        self.ids.copy_(self.head(rms(h, self.blocks[0].n1 if self.blocks else 1))[:, -1].argmax(-1, keepdim=True))
        self.pos.add_(1).remainder_(CACHE)


def linear_factory(kind: str, bits: int, device: str):
    """nn.Linear in fp16, or a NestedLinear of a random 8-bit parent's r-bit slice (kind = a Resident value)."""
    gen = torch.Generator(device=device).manual_seed(0)

    def make(n: int, k: int) -> nn.Module:
        if kind == "fp16":
            lin = nn.Linear(k, n, bias=False, device=device, dtype=torch.float16)
            nn.init.normal_(lin.weight, std=0.02)
            return lin
        g = k // GROUP
        q = QuantizedWeight(
            torch.randint(0, 256, (n, k), generator=gen, device=device, dtype=torch.uint8),
            torch.full((n, g), 2e-4, device=device, dtype=torch.float16),
            torch.randint(96, 160, (n, g), generator=gen, device=device, dtype=torch.uint8),
            torch.arange(k, dtype=torch.int32, device=device) // GROUP,
            8,
        )
        return NestedLinear(q, bits, None, torch.float16, Resident(kind))

    return make


def step_seconds(model: Decoder, tiny: bool) -> float:
    """Seconds per decode step, the step captured as one CUDA graph (_kernels.graph_us)."""
    return graph_us([model.step], tiny, replays=STEPS, warmups=3) / 1e6


VARIANTS = [("fp16", 16), ("slice", 4), ("slice", 3), ("slice", 2), ("parent", 4), ("parent", 2)]


def measure(tiny: bool) -> dict:
    device, s = ("cpu", TINY) if tiny else ("cuda", SHAPE)
    blocks, batches = (1, [1]) if tiny else (BLOCKS, [1, 16])
    rows = []
    for batch in batches:
        base = step_seconds(Decoder(s, 0, linear_factory("fp16", 16, device), batch, device), tiny)
        for kind, bits in VARIANTS:
            torch.cuda.empty_cache() if not tiny else None
            model = Decoder(s, blocks, linear_factory(kind, bits, device), batch, device)
            layer_bytes = sum(
                t.numel() * t.element_size()
                for blk in model.blocks
                for t in list(blk.parameters()) + list(blk.buffers())
            )
            sec = step_seconds(model, tiny)
            rows.append(
                {
                    "variant": kind,
                    "bits": bits,
                    "batch": batch,
                    "blocks": blocks,
                    "step_ms": sec * 1e3,
                    "tokens_per_s": batch / sec,
                    "block_ms": (sec - base) * 1e3 / blocks,
                    "block_bytes": layer_bytes / blocks,
                    "head_and_embed_ms": base * 1e3,
                }
            )
            del model
    for r in rows:
        fp16 = next(x for x in rows if x["variant"] == "fp16" and x["batch"] == r["batch"])
        r["speedup_vs_fp16"] = fp16["step_ms"] / r["step_ms"] if not math.isnan(r["step_ms"]) else float("nan")
        r["block_speedup_vs_fp16"] = fp16["block_ms"] / r["block_ms"] if r["block_ms"] > 0 else float("nan")
    return {"shape": s, "cache": CACHE, "rows": rows}
