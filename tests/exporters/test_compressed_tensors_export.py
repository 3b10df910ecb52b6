"""compressed-tensors `pack-quantized` export (src/matgptq/exporters/compressed_tensors.py, its bytes
src/matgptq/formats/compressed_tensors/), checked without the peer: the packer against its bit-by-bit definition, the
written files read back by our own reading of the format (codes, scales, zero points, config groups, ignored layers,
other tensors), and the refusals. The independent readers
(compressed-tensors' decompressor, transformers): test_compressed_tensors.py; the sources and exports are in
ct_helpers.py, built once for both modules (conftest.py).

  * Not representable, refused by the export: act-order groups (compressed-tensors 0.19 removed actorder "group" and
    weight_g_idx: QuantizationArgs(actorder="group") raises), asymmetric slices whose zero is not a multiple of 2^d.
    Ragged groups written as such (group_size 32 on 172 columns) fail in both readers ("tensor column shape must be
    divisble by the given group_size"); the export therefore repeats scales at group size gcd(g, K) instead.
"""

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from matgptq.cli import main
from matgptq.errors import UserError
from matgptq.exporters.compressed_tensors import export_compressed_tensors
from matgptq.formats.compressed_tensors import CT_VERSION, pack_int32, unpack_int32
from matgptq.formats.parent import read_checkpoint
from tests.exporters.ct_helpers import EXPORTS, _config, _expected, _per_column, _schemes, _slices


@pytest.fixture(scope="module")
def cache(ct_cache):  # conftest.py's one Cache for both compressed-tensors modules: each source quantized once
    return ct_cache


# ------------------------------------------------------------------------------------- (c) pure: packer and reader


def _pack_bit_by_bit(u: np.ndarray, bits: int) -> np.ndarray:
    """The definition, one bit at a time: bit i of value k of a row is stream bit k·bits + i = bit (that mod 32) of
    word (that // 32); words are read as two's-complement int32."""
    rows, n = u.shape
    words = np.zeros((rows, -(-n * bits // 32)), dtype=np.int64)
    for row in range(rows):
        for k in range(n):
            for i in range(bits):
                if (int(u[row, k]) >> i) & 1:
                    j = k * bits + i
                    words[row, j // 32] |= 1 << (j % 32)
    return np.where(words >= 1 << 31, words - (1 << 32), words).astype(np.int32)


@pytest.mark.parametrize("bits", range(1, 9))
def test_packer_matches_bit_by_bit_definition(bits):
    gen = np.random.default_rng(bits)
    for n in (1, 7, 31, 32, 33, 64, 172):
        u = gen.integers(0, 1 << bits, size=(3, n), dtype=np.uint8)
        u[0, :] = (1 << bits) - 1  # all ones: every bit and the sign bit of every word
        words = pack_int32(u, bits)
        assert words.dtype == np.int32 and words.shape == (3, -(-n * bits // 32))
        assert np.array_equal(words, _pack_bit_by_bit(u, bits)), (bits, n)
        assert np.array_equal(unpack_int32(words, bits, n), u)
        assert np.array_equal(pack_int32(unpack_int32(words, bits, n), bits), words)  # padding bits stay zero


@pytest.mark.parametrize("export_id", EXPORTS)
def test_round_trip_through_our_reader(cache, export_id):
    """Our own reading of the written files gives back the slice exactly; layout, config and other tensors."""
    out = cache.export(export_id)
    slices, ckpt = _slices(cache, export_id)
    raw, qc = load_file(str(out / "model.safetensors")), _config(out)
    schemes = _schemes(qc)
    targets = [n for g in qc["config_groups"].values() for n in g["targets"]]
    assert sorted(targets) == sorted(slices) and len(targets) == len(set(targets))  # disjoint, complete
    skipped = [f"model.layers.{i}.mlp.down_proj" for i in range(5)] if "skip" in export_id else []
    assert qc["ignore"] == skipped + ["lm_head"]  # every other Linear, in module order
    assert (qc["quant_method"], qc["format"], qc["quantization_status"], qc["version"]) == (
        "compressed-tensors",
        "pack-quantized",
        "compressed",
        CT_VERSION,
    )
    for name, q in slices.items():
        w, (n, k), want = schemes[name], q.shape, _expected(q)
        assert w["num_bits"] == q.bits and w["symmetric"] == want["sym"]
        assert raw[f"{name}.weight_shape"].dtype == torch.int64 and raw[f"{name}.weight_shape"].tolist() == [n, k]
        packed, scale = raw[f"{name}.weight_packed"], raw[f"{name}.weight_scale"]
        assert packed.dtype == torch.int32 and packed.shape == (n, -(-k * q.bits // 32))
        assert scale.dtype == torch.float32 and f"{name}.weight" not in raw
        codes = torch.from_numpy(unpack_int32(packed.numpy(), q.bits, k)).int() - (1 << (q.bits - 1))
        assert torch.equal(codes, want["q"])
        assert torch.equal(_per_column(scale, w, k), want["scale"])
        if want["sym"]:
            assert f"{name}.weight_zero_point" not in raw
            continue
        zp = raw[f"{name}.weight_zero_point"]
        assert zp.dtype == torch.int32 and zp.shape == (-(-n * q.bits // 32), scale.shape[1])
        zp = torch.from_numpy(unpack_int32(zp.numpy().T, q.bits, n).T).int() - (1 << (q.bits - 1))
        assert torch.equal(_per_column(zp, w, k), want["zp"])
        assert torch.equal((codes - _per_column(zp, w, k)) * _per_column(scale, w, k), q.dequantize())
    for name, t in ckpt.tensors.items():
        assert torch.equal(raw[name], t)
    assert (out / "tokenizer.json").is_file()


def test_ragged_groups_repeat_scales(cache):
    """stories260K's down_proj (172 columns) at group size 32 is written at gcd(32, 172) = 4, the rest at 32."""
    out = cache.export("stories-sym-g32-ragged-4bit")
    qc = _config(out)
    sizes = {g["weights"]["group_size"]: g["targets"] for g in qc["config_groups"].values()}
    assert sorted(sizes) == [4, 32] and all(n.endswith("down_proj") for n in sizes[4]) and len(sizes[4]) == 5
    scale = load_file(str(out / "model.safetensors"))["model.layers.0.mlp.down_proj.weight_scale"]
    assert scale.shape == (64, 43) and torch.equal(scale[:, :8], scale[:, :1].expand(-1, 8))


# ------------------------------------------------------------------------------------------ (d) refusals (CLI)


def _refused(capsys, argv, out, match):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("matgptq: error: ") and err.count("\n") == 1 and match in err, err
    assert not out.exists() and not list(out.parent.glob(f".{out.name}.tmp-*"))


def test_cli_writes_and_refuses(cache, tmp_path, capsys):
    src = str(cache.source("sym-g32"))
    out = tmp_path / "ct"
    assert main(["export", src, "--format", "compressed-tensors", "--bits", "4", "--out", str(out)]) == 0
    assert "compressed-tensors" in capsys.readouterr().out and (out / "config.json").is_file()
    before = (out / "model.safetensors").stat().st_mtime_ns
    assert main(["export", src, "--format", "compressed-tensors", "--bits", "3", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and err.count("\n") == 1
    assert (out / "model.safetensors").stat().st_mtime_ns == before and _config(out)["config_groups"]["group_0"][
        "weights"
    ]["num_bits"] == 4
    new = tmp_path / "new"
    for bits in ("9", "1"):
        _refused(
            capsys,
            ["export", src, "--format", "compressed-tensors", "--bits", bits, "--out", str(new)],
            new,
            f"cannot use {bits} bits",
        )


@pytest.mark.parametrize(
    "source,bits,match",
    [("ao-dynamic", "4", "without --no-static-groups"), ("asym-parent", "4", "not multiples of 2^4")],
)
def test_cli_refuses_what_compressed_tensors_cannot_hold(cache, tmp_path, capsys, source, bits, match):
    out = tmp_path / "ct"
    _refused(
        capsys,
        ["export", str(cache.source(source)), "--format", "compressed-tensors", "--bits", bits, "--out", str(out)],
        out,
        match,
    )


def test_asym_parent_master_width_is_exact(cache, tmp_path):
    """The asymmetric parent refused at 4 bits exports at its master width (shift 0: every zero is an integer)."""
    out = export_compressed_tensors(cache.source("asym-parent"), tmp_path / "ct", bits=8)
    q = read_checkpoint(cache.source("asym-parent")).layers["model.layers.1.mlp.up_proj"]
    zp = load_file(str(out / "model.safetensors"))["model.layers.1.mlp.up_proj.weight_zero_point"]
    assert torch.equal(torch.from_numpy(unpack_int32(zp.numpy().T, 8, 128).T).int(), q.zeros.int())
    with pytest.raises(UserError, match="act-order"):
        export_compressed_tensors(cache.source("ao-dynamic"), tmp_path / "ao", bits=4)
