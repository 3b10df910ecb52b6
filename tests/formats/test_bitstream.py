"""The parent's bit stream (formats/bitstream.py): round trips, sizes, and the stream its docstring defines."""

import itertools

import numpy as np
import pytest
import torch

from matgptq.formats.bitstream import pack_bits, unpack_bits


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 7, 8])
def test_pack_bits_round_trip_and_size(bits):
    codes = torch.randint(0, 2**bits, (5, 43), dtype=torch.uint8)
    packed = pack_bits(codes, bits)
    assert packed.shape == (5, -(-43 * bits // 8))
    assert torch.equal(unpack_bits(packed, bits, 43), codes)
    # the stream is little-endian: code 0 is in the low bits of byte 0
    one = torch.zeros(1, 8, dtype=torch.uint8)
    one[0, 0] = 1
    assert int(pack_bits(one, bits)[0, 0]) == 1


@pytest.mark.parametrize("bits", [2, 3, 4, 6])
def test_pack_bits_is_the_stream_its_docstring_defines(bits):
    """Oracles: a loop over the definition (stream bit k·b + j is bit j of code k; stream bit i is bit i mod 8 of byte
    ⌊i/8⌋) and numpy's packbits of the code bits in little bit order, as the parent files have been written since v1."""
    codes = torch.randint(0, 2**bits, (3, 29), generator=torch.Generator().manual_seed(bits), dtype=torch.uint8)
    looped = np.zeros((3, -(-29 * bits // 8)), dtype=np.uint8)
    for r, k, j in itertools.product(range(3), range(29), range(bits)):
        i = k * bits + j
        looped[r, i // 8] |= ((int(codes[r, k]) >> j) & 1) << (i % 8)
    planes = (codes.numpy()[..., None] >> np.arange(bits, dtype=np.uint8)) & 1
    numpy_stream = np.packbits(planes.reshape(3, -1), axis=1, bitorder="little")
    assert np.array_equal(pack_bits(codes, bits).numpy(), looped) and np.array_equal(numpy_stream, looped)
