"""The width spec (formats/mix.py): the one parser every command and API call uses for `bits` / `bits_config`."""

from __future__ import annotations

import json

import pytest

from matgptq.errors import UserError
from matgptq.formats.mix import read_mix, width_spec, width_specs

NAMES = ["model.layers.0.mlp.up_proj", "model.layers.0.mlp.down_proj"]


def test_every_form_gives_every_layer_its_width(tmp_path):
    mix = {NAMES[0]: 3, "*": 8}
    (tmp_path / "plain.json").write_text(json.dumps(mix))
    (tmp_path / "search.json").write_text(json.dumps({"budget": 3.5, "bits": mix}))  # as `matgptq search` nests it
    expected = {NAMES[0]: 3, NAMES[1]: 8}
    for spec in (mix, str(tmp_path / "plain.json"), tmp_path / "search.json"):
        assert read_mix(spec, NAMES) == expected
    assert read_mix(4, NAMES) == read_mix("4", NAMES) == dict.fromkeys(NAMES, 4)


@pytest.mark.parametrize(
    "spec,words",
    [
        ({NAMES[0]: 3}, "misses 1 layers"),
        ({"x": 3, "*": 4}, "unknown layers"),
        ({"*": 3.5}, "must be integers"),
        ([3], "must be an int"),
    ],
)
def test_bad_specs_are_one_line(spec, words):
    with pytest.raises(UserError, match=words):
        read_mix(spec, NAMES)


def test_bits_or_bits_config_and_eval_lists():
    assert width_spec(3, None) == 3 and width_spec(None, "m.json") == "m.json" and width_spec(None, None) is None
    with pytest.raises(UserError, match="either --bits or --bits-config, not both"):
        width_spec(3, {"*": 4})
    assert width_specs("3,4, 8") == [3, 4, 8] and width_specs("mixes/mix-3.5.json") == ["mixes/mix-3.5.json"]
