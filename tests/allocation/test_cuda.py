"""The search on a GPU (skipped without CUDA; `make gpu-check` runs it compiled): Fitness moves the parent's codes to
the device once, so set_bits slices and dequantizes there, and the ERROR table dequantizes there too.

set_bits: what it writes equals the CPU's slice bit for bit. QuantizedWeight.dequantize is elementwise (a gather, a
product, a difference, a product), each operation rounded once in float32 on either device (torch's eager kernels
fuse none of them), so no tolerance applies.

ERROR table: Σ (W(r) − W(top))² · imatrix in float64, the weight terms identical on both devices and the imatrix the
mean square of each layer's inputs from float32 forwards, whose GEMMs sum in other orders on the GPU: each activation
moves by about n·ε₃₂ relative per layer (n ≤ 256, stories260K's widest input; ε₃₂ = 6e-8), through 5 blocks at most
5·256·6e-8 ≈ 8e-5, its square twice that; rel 1e-3 leaves a factor of five.
"""

from __future__ import annotations

import pytest
import torch

import matgptq
from matgptq.allocation.allocators import error_table
from matgptq.allocation.fitness import Fitness
from matgptq.evaluation.teacher import Teacher
from matgptq.formats import read_checkpoint
from matgptq.models import calibration_windows, layer_weight, load_tokenizer, read_text, tokenize
from tests.conftest import STORIES, TINYSTORIES

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
LEVELS = (2, 3, 4, 6, 8)  # stories_parent's widths


@pytest.fixture(scope="module")
def pair(stories_parent):
    """(Fitness on the CPU, Fitness on the GPU) of stories_parent, every layer at 8 bits, on 6 × 64 tokens."""
    windows = calibration_windows(tokenize(load_tokenizer(STORIES), read_text(TINYSTORIES, (0.6, 0.7))), 6, 64, 0)
    names = tuple(read_checkpoint(stories_parent).layers)
    out, teachers = [], []
    for device in ("cpu", "cuda"):
        teachers.append(Teacher(matgptq.load(STORIES).to(device), windows, batch_size=4))
        model = matgptq.load(stories_parent, bits=8, packed=False).to(device)
        out.append(Fitness(model, teachers[-1], windows, names, batch_size=4))
    yield tuple(out)
    for t in teachers:
        t.close()


def test_set_bits_slices_on_the_device(pair):
    cpu, gpu = pair
    assert all(gpu.model.matgptq.layers[n].codes.is_cuda for n in gpu.names)
    assert not any(cpu.model.matgptq.layers[n].codes.is_cuda for n in cpu.names)
    mix = tuple(LEVELS[i % len(LEVELS)] for i in range(len(gpu.names)))
    for f in pair:
        f.apply(mix)
    for name in gpu.names:
        a, b = (layer_weight(f.model, name, f.spec) for f in pair)
        assert b.is_cuda and torch.equal(a, b.cpu()), name


def test_the_error_table_on_the_device(pair):
    cpu, gpu = pair
    want, got = (error_table(f, LEVELS, (0, 1, 2)) for f in pair)
    for row_cpu, row_gpu in zip(want, got):
        assert row_gpu == pytest.approx(row_cpu, rel=1e-3)
