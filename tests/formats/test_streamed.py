"""formats/streamed.py: a safetensors file written group by group, read back by safetensors itself (the oracle)."""

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from matgptq.formats.streamed import DTYPES, ELEMENT_BYTES, Entry, Group, entries_of, write_streamed


def _tensors(seed: int) -> dict[str, torch.Tensor]:
    """Every dtype the writer knows, odd sizes (so a careless layout would misalign), a scalar and an empty tensor."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for i, dtype in enumerate(DTYPES):
        shape = (3, 5 + i) if i % 2 else (7 + i,)
        if dtype.is_floating_point:
            out[f"t{i}.{dtype}"] = torch.randn(shape, generator=gen).to(dtype)
        else:
            high = 2 if dtype is torch.bool else 100
            out[f"t{i}.{dtype}"] = torch.randint(0, high, shape, generator=gen).to(dtype)
    out["scalar"] = torch.tensor(2.5, dtype=torch.float16)
    out["empty"] = torch.zeros(0, 4, dtype=torch.int32)
    return out


def test_groups_read_back_by_safetensors(tmp_path):
    tensors = _tensors(0)
    names = list(tensors)
    parts = [dict((k, tensors[k]) for k in names[a:b]) for a, b in ((0, 4), (4, 9), (9, len(names)))]
    loads = []

    def loader(part):
        def load():
            loads.append(len(part))
            return {k: v.clone() for k, v in part.items()}

        return load

    path = tmp_path / "x.safetensors"
    nbytes = write_streamed(path, [Group(entries_of(p), loader(p)) for p in parts], {"format": "pt", "k": "v"})
    assert loads == [len(p) for p in parts]  # each group read once, in order
    back = load_file(str(path))
    assert set(back) == set(tensors)
    for k, t in tensors.items():
        assert back[k].dtype == t.dtype and torch.equal(back[k], t), k
    with safe_open(str(path), "pt") as f:
        assert f.metadata() == {"format": "pt", "k": "v"}
    assert nbytes == sum(t.numel() * t.element_size() for t in tensors.values())
    assert path.stat().st_size == 8 + int.from_bytes(path.read_bytes()[:8], "little") + nbytes


def test_every_tensor_starts_on_a_multiple_of_its_element_size(tmp_path):
    tensors = _tensors(1)
    path = tmp_path / "x.safetensors"
    write_streamed(path, [Group(entries_of(tensors), lambda: tensors)], {})
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert n % 8 == 0
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__")
    for name, e in header.items():
        assert e["data_offsets"][0] % ELEMENT_BYTES[e["dtype"]] == 0, name


def test_tensors_other_than_announced_are_refused(tmp_path):
    t = {"a": torch.zeros(3)}
    wrong = [Entry("a", "F32", (4,))]
    with pytest.raises(RuntimeError, match="not those its header announced"):
        write_streamed(tmp_path / "x.safetensors", [Group(wrong, lambda: t)], {})
    with pytest.raises(RuntimeError, match="two groups"):
        write_streamed(tmp_path / "y.safetensors", [Group(entries_of(t), lambda: t)] * 2, {})


def test_same_header_and_data_as_safetensors_own_writer(tmp_path):
    """Parsed header equal (safetensors writes its metadata map in hash order, so raw header bytes vary) and data
    bytes identical: the same layout as save_file's, so a streamed checkpoint is the file the in-memory path wrote."""
    tensors = _tensors(2)
    save_file(tensors, str(tmp_path / "ref.safetensors"), metadata={"format": "pt"})
    half = len(tensors) // 2
    names = list(tensors)
    parts = [{k: tensors[k] for k in names[:half]}, {k: tensors[k] for k in names[half:]}]
    write_streamed(tmp_path / "x.safetensors", [Group(entries_of(p), lambda p=p: p) for p in parts], {"format": "pt"})

    def split(path):
        raw = path.read_bytes()
        n = int.from_bytes(raw[:8], "little")
        return json.loads(raw[8 : 8 + n]), raw[8 + n :]

    assert split(tmp_path / "x.safetensors") == split(tmp_path / "ref.safetensors")
