"""Helpers of the peer-free GPTQ export tests (tests/exporters/test_gptq_export*.py): synthetic matgptq parents with
random codes (no calibration), and small checks shared by the round-trip, padded-shape and refusal modules."""

import json

import torch
from safetensors.torch import load_file

from matgptq.formats.parent import save_checkpoint
from matgptq.formats.quantized import QuantizedWeight

GROUP = 32


def _layer(n, k, sym, act_order, gen, master=8, group=GROUP):
    """A random parent layer: `master`-bit codes; sym zero 2^(master-1), asym zeros in [0, 2^master) including 0."""
    ngroups = -(-k // group) if group > 0 else 1
    codes = torch.randint(0, 1 << master, (n, k), generator=gen, dtype=torch.int32).to(torch.uint8)
    if sym:
        zeros = torch.full((n, ngroups), 1 << (master - 1), dtype=torch.uint8)
    else:
        zeros = torch.randint(0, 1 << master, (n, ngroups), generator=gen, dtype=torch.int32).to(torch.uint8)
        zeros[0, 0] = 0
    scales = (torch.rand(n, ngroups, generator=gen) * 0.01 + 1e-3).half()
    size = k if group == -1 else group
    perm = torch.randperm(k, generator=gen) if act_order else None
    order = torch.argsort(perm) if act_order else torch.arange(k)
    # per-width scales (a v2 parent, as the default variant writes) on sym parents: slices must carry them out
    width_scales = (
        {r: (scales.float() * (0.9 + 0.2 * torch.rand(scales.shape, generator=gen))).half() for r in range(2, master)}
        if sym
        else None
    )
    return QuantizedWeight(codes, scales, zeros, (order // size).to(torch.int32), master, 0, perm, width_scales)


def synthetic(path, model_dir, sym=True, act_order=False, master=8, group=GROUP, shapes=None, seed=0):
    """A matgptq checkpoint of `model_dir`'s architecture with random codes (no calibration): fast, all combinations."""
    gen = torch.Generator().manual_seed(seed)
    fp = load_file(str(model_dir / "model.safetensors"))
    config = json.loads((model_dir / "config.json").read_text())
    if shapes is None:
        shapes = {k[: -len(".weight")]: tuple(v.shape) for k, v in fp.items() if k.endswith("_proj.weight")}
    layers = {name: _layer(n, k, sym, act_order, gen, master, group) for name, (n, k) in shapes.items()}
    tensors = {k: v for k, v in fp.items() if k[: -len(".weight")] not in layers}
    meta = {
        "quantization": {
            "method": "matgptq",
            "bits": master,
            "group_size": group,
            "sym": sym,
            "act_order": act_order,
            "damp": 0.01,
            "true_sequential": True,
            "static_groups": False,
        }
    }
    return save_checkpoint(path, config, tensors, layers, meta, model_dir)


def _no_output(out):
    assert not out.exists()
    assert not list(out.parent.glob(f".{out.name}.tmp-*")), "a temporary directory was left behind"


def _logits(model):
    ids = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model(ids).logits


def _relabel(path, **fields):
    for f in (path / "quantize_config.json",):
        qc = json.loads(f.read_text())
        qc.update(fields)
        f.write_text(json.dumps(qc))
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"].update(fields)
    (path / "config.json").write_text(json.dumps(cfg))
