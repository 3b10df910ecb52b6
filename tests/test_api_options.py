"""Options defined once (quantization/options.py, cli/quantize_flags.py): every field of the typed configs is set by a
keyword of `matgptq.quantize` and every keyword by a flag of `matgptq quantize`, read from the configs and the parser
themselves; the command, the short keywords and a config object build the same configs; no two public classes share
a name."""

import argparse
import dataclasses
import importlib
import inspect
import json
import re
from pathlib import Path

import pytest

import matgptq
from matgptq.cli import quantize as quantize_command
from matgptq.quantization import CalibConfig, GPTQConfig, MatGPTQConfig, RTNConfig, RunConfig, Variant
from matgptq.quantization import options as opts
from matgptq.quantization.options import KEYWORDS, Part, choices_of, configs_of
from tests.conftest import STORIES, TINYSTORIES

SRC = Path(matgptq.__file__).parent


def quantize_parser() -> argparse.ArgumentParser:
    sub = argparse.ArgumentParser().add_subparsers()
    quantize_command.add_parser(sub)
    return sub.choices["quantize"]


def positional_parameters() -> set[str]:
    """`matgptq.quantize`'s own arguments (the model and the output), which the command takes as such."""
    params = inspect.signature(matgptq.quantize).parameters.values()
    return {p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty}


def gaps(keywords: dict, dests: set[str]) -> list[str]:
    """What is not defined once: a field of a config no keyword sets, a keyword setting what its configs lack, a
    keyword without a flag, a flag without a keyword."""
    out = []
    for classes in dict.fromkeys(configs_of(p) for p in Part):  # the method configs take two parts' keywords
        names = "/".join(cls.__name__ for cls in classes)
        parts = [p for p in Part if configs_of(p) == classes]
        set_here = {f for kw in keywords.values() if kw.part in parts for f in kw.fields}
        out += [f"field {f} of {names} has no keyword" for f in choices_of(parts[0]) if f not in set_here]
        out += [
            f"a keyword sets {f}, which {names} lack"
            for f in set_here
            if f not in choices_of(parts[0]) and not any(hasattr(cls, f) for cls in classes)
        ]
    out += [f"keyword {k} has no flag" for k in keywords if k not in dests]
    out += [f"flag for {d} gives no keyword" for d in dests if d not in keywords and d not in positional_parameters()]
    return out


def parser_dests() -> set[str]:
    return {a.dest for a in quantize_parser()._actions if a.dest != "help"}


def test_every_config_field_has_a_keyword_and_every_keyword_a_flag():
    assert gaps(KEYWORDS, parser_dests()) == []
    assert "sha256" not in KEYWORDS  # the calibration text's hash: a record of the run, not a choice


def test_a_field_added_to_a_config_is_a_keyword_and_fails_until_it_has_a_flag(monkeypatch):
    """The check above, on a method config with one more field: the API takes it at once, the CLI lacks it (and on
    a flag more)."""
    assert gaps(KEYWORDS, parser_dests() | {"stray"}) == ["flag for stray gives no keyword"]
    grown = dataclasses.make_dataclass(
        "GrownConfig", [("new_option", int, dataclasses.field(default=1))], bases=(GPTQConfig,), frozen=True
    )
    monkeypatch.setitem(opts.CONFIGS, next(iter(opts.CONFIGS)), grown)
    keywords = opts.derive_keywords()
    assert keywords["new_option"] == opts.Keyword(Part.METHOD, ("new_option",))
    assert gaps(keywords, parser_dests()) == ["keyword new_option has no flag"]


def test_help_lists_every_flag(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")
    with pytest.raises(SystemExit):
        quantize_parser().parse_args(["--help"])
    text = capsys.readouterr().out
    flags = [s for a in quantize_parser()._actions for s in a.option_strings]
    assert len(flags) > len(KEYWORDS) and [f for f in flags if not re.search(rf"{re.escape(f)}\b", text)] == []


@pytest.fixture
def handed(monkeypatch):
    """What `matgptq.quantize` hands the run: the method, calibration and run configs, the calibration and the mix."""
    calls = []

    def run(source, out, cfg, calib_cfg, calib, bits_config, dtype, dev, **kw):
        calls.append((cfg, calib_cfg, calib, bits_config, dtype, dev, kw))
        return out, []

    monkeypatch.setattr(matgptq.api, "run_quantization", run)
    monkeypatch.setattr(quantize_command, "split_groups_note", lambda out: "")
    return calls


RUN_FLAGS = [
    "--calib-range",
    "0.5:1",
    "--nsamples",
    "7",
    "--seqlen",
    "33",
    "--seed",
    "3",
    "--dtype",
    "float32",
    "--device",
    "cpu",
    "--no-stream",
    "--shard-size",
    "0.5",
    "--quiet",
    "--overwrite",
]
RUN_KEYWORDS = dict(
    calib_range=(0.5, 1),
    nsamples=7,
    seqlen=33,
    seed=3,
    dtype="float32",
    device="cpu",
    stream=False,
    shard_bytes=2**19,
    progress=False,
    overwrite=True,
)
CASES = [  # the flags, the same as keywords, the same as a config (the oracle: the configs' own constructors)
    ([], {}, GPTQConfig()),
    (
        ["--method", "rtn", "--bits", "3", "--group-size", "64", "--asym", "--mse"],
        dict(method="rtn", bits=3, group_size=64, sym=False, mse=True),
        RTNConfig(bits=3, group_size=64, sym=False, mse=True),
    ),
    (
        ["--method", "matgptq", "--bits", "3,4,8", "--bit-weights", "1,2,4", "--variant", "paper", "--no-mse"],
        dict(method="matgptq", bits=(3, 4, 8), bit_weights=(1, 2, 4), variant="paper", mse=False),
        MatGPTQConfig(bits=8, target_bits=(3, 4, 8), bit_weights=(1.0, 2.0, 4.0), variant=Variant.PAPER, mse=False),
    ),
    (
        ["--method", "matgptq", "--bits", "2,3,4", "--master-bits", "4", "--kquant", "q3_k", "--group-size", "16"],
        dict(method="matgptq", bits="2,3,4", master_bits=4, kquant="q3_k", group_size=16),
        MatGPTQConfig(bits=4, target_bits=(2, 3, 4), kquant="q3_k", group_size=16),
    ),
    (
        [
            "--bits",
            "3",
            "--group-act-order",
            "--damp",
            "0.05",
            "--block-size",
            "32",
            "--no-true-sequential",
            "--skip",
            "mlp",
            "--skip",
            "o_proj",
            "--target",
            "gguf",
            "--no-refit-scales",
            "--no-mse-weighted",
            "--signed-scale",
        ],
        dict(
            bits=3,
            group_act_order=True,
            damp=0.05,
            block_size=32,
            true_sequential=False,
            skip=["mlp", "o_proj"],
            target="gguf",
            refit_scales=False,
            mse_weighted=False,
            signed_scale=True,
        ),
        GPTQConfig(
            bits=3,
            group_act_order=True,
            damp=0.05,
            block_size=32,
            true_sequential=False,
            skip=("mlp", "o_proj"),
            target="gguf",
            refit_scales=False,
            mse_weighted=False,
            signed_scale=True,
        ),
    ),
    (
        ["--act-order", "--no-static-groups", "--resume"],
        dict(act_order=True, static_groups=False, resume=True),
        GPTQConfig(act_order=True, static_groups=False),
    ),
]


@pytest.mark.parametrize("flags,keywords,config", CASES)
@pytest.mark.parametrize("run", [False, True])
def test_the_command_the_keywords_and_a_config_build_the_same_run(tmp_path, handed, flags, keywords, config, run):
    """Each case three ways; the method config is the one its class builds from the same settings, and the other
    configs are as given (with `run`: every calibration and run option set too)."""
    out = tmp_path / "out"
    extra = dict(RUN_KEYWORDS) if run else {}
    rest = {k: v for k, v in keywords.items() if KEYWORDS[k].part is not Part.METHOD}
    assert (
        matgptq.cli.main(
            [
                "quantize",
                str(STORIES),
                "--out",
                str(out),
                "--calib",
                str(TINYSTORIES),
                *flags,
                *(RUN_FLAGS if run else []),
            ]
        )
        == 0
    )
    matgptq.quantize(STORIES, out, calib=str(TINYSTORIES), **keywords, **extra)
    matgptq.quantize(STORIES, out, config, calib=str(TINYSTORIES), **rest, **extra)
    cli, api, obj = handed
    assert cli == api == obj
    cfg, calib_cfg, calib, bits_config, dtype, dev, kw = cli
    assert cfg == config and type(cfg) is type(config) and bits_config is None and calib == str(TINYSTORIES)
    given = {**{f.name: getattr(RunConfig(), f.name) for f in dataclasses.fields(RunConfig)}, **extra, **rest}
    assert (dtype, dev.type, kw) == (given["dtype"], "cpu", {k: given[k] for k in kw})
    calibration = dict(text_range=(0.5, 1.0), nsamples=7, seqlen=33, seed=3) if run else {}
    assert calib_cfg == CalibConfig(path=str(TINYSTORIES), **calibration)


def test_a_mix_is_the_same_from_the_flag_the_keyword_and_a_config(tmp_path, handed):
    """--bits-config and bits_config are the mix as given; with a config object too. A config's own layer_bits (a
    checkpoint's record) is that mix with "*" at the config's width, checked against the model's layers as the
    file is."""
    mix = tmp_path / "mix.json"
    mix.write_text(json.dumps({"*": 4, "model.layers.0.mlp.up_proj": 3}))
    out = tmp_path / "out"
    assert (
        matgptq.cli.main(
            [
                "quantize",
                str(STORIES),
                "--out",
                str(out),
                "--calib",
                str(TINYSTORIES),
                "--group-size",
                "32",
                "--bits-config",
                str(mix),
            ]
        )
        == 0
    )
    matgptq.quantize(STORIES, out, calib=str(TINYSTORIES), group_size=32, bits_config=str(mix))
    matgptq.quantize(STORIES, out, GPTQConfig(group_size=32), calib=str(TINYSTORIES), bits_config=str(mix))
    assert handed[0] == handed[1] == handed[2]
    assert handed[0][0] == GPTQConfig(group_size=32) and handed[0][3] == str(mix)
    recorded = GPTQConfig(
        bits=4, group_size=32, layer_bits=(("model.layers.0.mlp.up_proj", 3), ("model.layers.1.mlp.up_proj", 4))
    )
    matgptq.quantize(STORIES, out, recorded, calib=TINYSTORIES)
    assert handed[3][0] == recorded
    assert handed[3][3] == {"*": 4, "model.layers.0.mlp.up_proj": 3, "model.layers.1.mlp.up_proj": 4}


@pytest.mark.parametrize(
    "call,message",
    [
        (
            lambda q: q(GPTQConfig(bits=4), method="gptq"),
            "either as config= or as keywords, not both: got config=GPTQConfig(...) and method",
        ),
        (
            lambda q: q(GPTQConfig(bits=4), group_size=64, nsamples=8),
            "not both: got config=GPTQConfig(...) and group_size",
        ),
        (lambda q: q(method="gptq", dampening=0.1), "unknown option(s) dampening (did you mean damp?)"),
        (lambda q: q({"method": "gptq"}), "config must be a method config (matgptq.GPTQConfig"),
        (lambda q: q(matgptq.MatGPTQQuantizationConfig(bits=3)), "got MatGPTQQuantizationConfig"),
        (lambda q: q(GPTQConfig(bits=4, layer_bits=(("a", 4),)), bits_config="mix.json"), "per-layer widths twice"),
    ],
)
def test_a_config_with_method_keywords_or_an_unknown_keyword_is_a_type_error(tmp_path, handed, call, message):
    with pytest.raises(TypeError, match=re.escape(message)):
        call(lambda *a, **kw: matgptq.quantize(STORIES, tmp_path / "out", *a, calib=TINYSTORIES, **kw))
    assert handed == [] and not (tmp_path / "out").exists()


def test_the_method_configs_are_exported_and_no_two_public_classes_share_a_name():
    """`matgptq.GPTQConfig` is the method config `quantize` takes; the transformers loading config has its own name.
    Every class a module exports (its __all__) is one class per name."""
    assert (matgptq.GPTQConfig, matgptq.MatGPTQConfig, matgptq.RTNConfig) == (GPTQConfig, MatGPTQConfig, RTNConfig)
    by_name: dict[str, set] = {}
    for path in sorted(SRC.rglob("*.py")):
        if not re.search(r"^__all__\b", path.read_text(encoding="utf-8"), re.M):
            continue
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        module = importlib.import_module(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj):
                by_name.setdefault(name, set()).add(obj)
                by_name.setdefault(obj.__name__, set()).add(obj)
    assert {n: c for n, c in by_name.items() if len(c) > 1} == {}
    assert {"GPTQConfig", "MatGPTQConfig", "MatGPTQQuantizationConfig"} <= set(by_name)
