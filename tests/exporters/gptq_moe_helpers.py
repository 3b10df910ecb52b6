"""Helpers of the MoE GPTQ export tests (test_gptq_export_moe.py, test_gptq_moe_interop.py): tiny random qwen3_moe,
mixtral and gpt_oss models (tests/models/test_moe.py's sizes) with every bias random, their quantized sources
(cached per session), and each GPTQ layer's weight as transformers' fused forward uses it."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

import matgptq
from matgptq.formats.parent import read_checkpoint
from tests.conftest import STORIES
from tests.models.test_arch import SIZES
from tests.models.test_moe import MOE

ROOT = Path(__file__).resolve().parents[2]
GROUP = 32
CALIB = ["Once upon a time there was a little girl who liked to play in the park with her dog. " * 8] * 4
MIX_WIDTHS = (4, 8, 2)  # a per-layer mix of the MatGPTQ parent's widths, cycled over its layers (experts included)


def moe_model(path, model_type):
    """A tiny random `model_type` (4 experts, top-2, 2 blocks); biases random too (gpt_oss initialises its expert
    and attention biases to 0, which would hide a misplaced bias), and the experts' fused weights 10× the init's
    std 0.02, so their activations leave SiLU's near-linear range around 0, where act(gate)·up ≈ act(up)·gate would
    hide swapped gate and up rows (measured: the swap moved qwen3_moe's logits by 0.9% at 1×, by 130% at 10×)."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **SIZES, **MOE[model_type]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
            elif p.ndim == 3:
                p.mul_(10)
    model.save_pretrained(path, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy2(STORIES / name, path / name)
    return path


class MoECache:
    """Per model type: the float model, a plain GPTQ 4-bit asymmetric checkpoint and a MatGPTQ (2, 4, 8) symmetric
    act-order parent, each built on first use."""

    def __init__(self, base):
        self.base, self.items = base, {}
        self.ids = torch.randint(3, 512, (2, 16), generator=torch.Generator().manual_seed(0))

    def _get(self, key, make):
        if key not in self.items:
            self.items[key] = make()
        return self.items[key]

    def model(self, model_type):
        return self._get(("fp", model_type), lambda: moe_model(self.base / f"fp-{model_type}", model_type))

    def source(self, model_type, kind):
        """kind "gptq4": method gptq, 4 bits, asymmetric, no act-order; "parent": matgptq 2,4,8, sym, act-order."""
        # the parent with the scale search off and λ_8 = 16, the options before issue #102: with today's defaults
        # GPTQModel's forward of gpt_oss' v2 mix leaves ours by 0.77 of the largest logit while every weight it
        # loads equals ours, not yet explained (the #102 closing note)
        kw = (
            dict(method="gptq", bits=4, sym=False)
            if kind == "gptq4"
            else dict(
                method="matgptq", bits=(2, 4, 8), act_order=True, static_groups=False, mse=False, bit_weights=(1, 1, 16)
            )
        )
        return self._get(
            ("src", model_type, kind),
            lambda: matgptq.quantize(
                self.model(model_type),
                self.base / f"{kind}-{model_type}",
                calib=CALIB,
                nsamples=4,
                seqlen=64,
                progress=False,
                group_size=GROUP,
                **kw,
            )[0],
        )

    def mix(self, model_type) -> dict[str, int]:
        names = sorted(read_checkpoint(self.source(model_type, "parent")).layers)
        return {n: MIX_WIDTHS[i % len(MIX_WIDTHS)] for i, n in enumerate(names)}


def gptq_weight(model, name: str) -> torch.Tensor:
    """The [out, in] weight that the GPTQ layer `name` must hold, read from our loaded (fused) model the way
    transformers' forward uses it: `<p>.experts.<e>.gate_proj` / `up_proj` are the first / second half of the rows
    of expert e's gate_up (`linear(x, gate_up_proj[e]).chunk(2, dim=-1)` → gate, up; gpt_oss' transposed storage
    [E, H, 2I] read as [2I, H]), down_proj is expert e's down_proj, anything else a Linear's weight."""
    parent, _, proj = name.rpartition(".")
    if ".experts." not in name:
        return model.get_submodule(name).weight
    path, _, e = parent.rpartition(".")
    experts = model.get_submodule(path)
    fused = "down_proj" if proj == "down_proj" else "gate_up_proj"
    w = getattr(experts, fused)[int(e)]
    w = w.T if experts.is_transposed else w
    half = w.shape[0] // 2
    return {"gate_proj": w[:half], "up_proj": w[half:], "down_proj": w}[proj]


def gptq_bias(model, name: str) -> torch.Tensor | None:
    """The bias the GPTQ layer `name` must carry (gpt_oss' experts: the same rows of the fused [E, out] bias)."""
    parent, _, proj = name.rpartition(".")
    if ".experts." not in name:
        return model.get_submodule(name).bias
    path, _, e = parent.rpartition(".")
    experts = model.get_submodule(path)
    if not getattr(experts, "has_bias", False):
        return None
    b = getattr(experts, "down_proj_bias" if proj == "down_proj" else "gate_up_proj_bias")[int(e)]
    half = b.shape[0] // 2
    return {"gate_proj": b[:half], "up_proj": b[half:], "down_proj": b}[proj]


# --- GPTQModel in a child process ------------------------------------------------------------------------------------
# Loading a qwen3_moe or mixtral model, GPTQModel's Defuser replaces transformers' sparse-MoE block classes for the
# rest of the process (defuser.replace_fused_blocks; there is no undo), so every such model built afterwards, ours
# included, would have per-expert Linears. GPTQModel therefore runs in a child, one per model type and test module.


def gptqmodel_runs(paths, ids: torch.Tensor, workdir) -> dict[str, dict]:
    """Per export directory in `paths`: GPTQModel 7.6's float16 CPU logits on `ids` ("logits") and, per quantized
    module, (bits, dequantized weight [out, in], bias) ("layers"), computed in a child process."""
    workdir = Path(workdir)
    torch.save({"ids": ids, "paths": [str(p) for p in paths]}, workdir / "peer_in.pt")
    env = dict(os.environ, GPTQMODEL_CPU_WORKERS="2", TORCHDYNAMO_DISABLE="1", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "tests.exporters.gptq_moe_helpers", str(workdir)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return torch.load(workdir / "peer_out.pt")


def _peer_child(workdir: Path) -> None:
    """The child of gptqmodel_runs: GPTQModel.load with the generic torch kernel (as test_gptq_interop.py)."""
    import gptqmodel as gm
    from gptqmodel.nn_modules.qlinear import BaseQuantLinear

    torch.set_num_threads(1)
    job, results = torch.load(workdir / "peer_in.pt"), {}
    for path in job["paths"]:
        model = gm.GPTQModel.load(path, backend=gm.BACKEND.GPTQ_TORCH, device="cpu", dtype=torch.float16).model
        with torch.no_grad():
            logits = model(job["ids"]).logits.float()
            layers = {
                n: (m.bits, m.dequantize_weight().T.contiguous(), None if m.bias is None else m.bias.clone())
                for n, m in model.named_modules()
                if isinstance(m, BaseQuantLinear)
            }
        results[path] = {"logits": logits, "layers": layers}
    torch.save(results, workdir / "peer_out.pt")


if __name__ == "__main__":
    _peer_child(Path(sys.argv[1]))
