"""CLI user experience: --help everywhere; bad input → one-line error, exit 2, no traceback, nothing written."""

import json
import subprocess
import sys

import pytest

from matgptq.cli import main
from tests.conftest import STORIES, TINYSTORIES, make_tiny_llama


@pytest.mark.parametrize("cmd", [[], ["quantize"], ["eval"], ["slice"], ["export"], ["search"]])
def test_help_everywhere(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        main(cmd + ["--help"])
    assert e.value.code == 0
    assert "usage: matgptq" in capsys.readouterr().out


def quantize_args(tmp_path, model=STORIES, calib=TINYSTORIES, *extra):
    return ["quantize", str(model), "--out", str(tmp_path / "out"), "--calib", str(calib), "--nsamples", "2",
            "--seqlen", "32", "--quiet", *extra]  # fmt: skip


def run_error(args, capsys):
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("matgptq: error: ") and err.count("\n") == 1 and "Traceback" not in err
    return err


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--bits", "9"], "bits must be between 2 and 8"),
        (["--bits", "1"], "bits must be between 2 and 8"),
        (["--group-size", "0"], "group size"),
        (["--group-size", "-2"], "group size"),
        (["--method", "gptq", "--bits", "3,4"], "one width"),
        (["--method", "matgptq", "--bits", "3,4", "--master-bits", "8"], "master width 8 must be one of"),
        (["--method", "matgptq", "--bits", "3,4,8", "--bit-weights", "1,1"], "2 bit weights for 3"),
        (["--method", "matgptq", "--bits", "3,9", "--master-bits", "8"], "between 2 and the master"),
    ],
)
def test_bad_options(tmp_path, capsys, extra, message):
    assert message in run_error(quantize_args(tmp_path, STORIES, TINYSTORIES, *extra), capsys)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("extra,mix,message", [
    (["--bits", "4"], {"*": 4}, "either --bits or --bits-config"),
    (["--method", "matgptq"], {"*": 4}, "already holds every width"),
    ([], {"*": 4, "model.layers.9.mlp.up_proj": 3}, "unknown layers"),
    ([], {"model.layers.0.mlp.up_proj": 3}, "misses 34 layers"),
    ([], {"*": 9}, "widths are 2..8"),
    ([], {"*": "4"}, "must be integers"),
])  # fmt: skip
def test_bad_width_mixes(tmp_path, capsys, extra, mix, message):
    (tmp_path / "mix.json").write_text(json.dumps(mix))
    args = quantize_args(tmp_path, STORIES, TINYSTORIES, "--bits-config", str(tmp_path / "mix.json"), *extra)
    assert message in run_error(args, capsys)
    assert not (tmp_path / "out").exists()


def test_missing_model_and_calibration(tmp_path, capsys):
    assert "no model found" in run_error(quantize_args(tmp_path, tmp_path / "nope"), capsys)
    assert "not found" in run_error(quantize_args(tmp_path, STORIES, tmp_path / "nope.txt"), capsys)
    empty = tmp_path / "empty.txt"
    empty.write_text("   \n")
    assert "no text" in run_error(quantize_args(tmp_path, STORIES, empty), capsys)
    short = tmp_path / "short.txt"
    short.write_text("Once upon a time.")
    err = run_error(quantize_args(tmp_path, STORIES, short), capsys)
    assert "fewer than one window of --seqlen 32" in err
    assert not (tmp_path / "out").exists()


def test_nan_weights_refused(tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    model = make_tiny_llama(tmp_path / "nan")
    tensors = load_file(model / "model.safetensors")
    tensors["model.layers.0.mlp.up_proj.weight"][0, 0] = float("nan")
    save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})
    assert "NaN or Inf" in run_error(quantize_args(tmp_path, model), capsys)
    assert not (tmp_path / "out").exists()


def test_existing_output_needs_overwrite(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("precious")
    assert "--overwrite" in run_error(quantize_args(tmp_path), capsys)
    assert (tmp_path / "out" / "keep.txt").read_text() == "precious"


def test_console_script_prints_no_traceback(tmp_path):
    exe = [sys.executable, "-m", "matgptq.cli"]
    r = subprocess.run(exe + quantize_args(tmp_path, tmp_path / "missing"), capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.startswith("matgptq: error:")


def test_quantize_then_eval_end_to_end(tmp_path, capsys):
    out = tmp_path / "q"
    args = ["quantize", str(STORIES), "--out", str(out), "--method", "gptq", "--bits", "4", "--calib", str(TINYSTORIES),
            "--calib-range", "0.6:1", "--nsamples", "16", "--seqlen", "128", "--quiet"]  # fmt: skip
    assert main(args) == 0
    assert "wrote" in capsys.readouterr().out
    js = tmp_path / "eval.json"
    assert main(["eval", str(out), "--text", str(TINYSTORIES), "--text-range", "0:0.6", "--max-tokens", "4096",
                 "--kl-to", str(STORIES), "--json", str(js)]) == 0  # fmt: skip
    import json

    row = json.loads(js.read_text())["results"][0]
    assert 4.0 < row["ppl"] < 6.0 and row["kl"] > 0 and row["tokens"] == 4096


def test_signed_scale_and_skip_validation(tmp_path, capsys):
    assert "symmetric grid" in run_error(quantize_args(tmp_path, STORIES, TINYSTORIES, "--asym", "--signed-scale"), capsys)
    assert "not a valid regular expression" in run_error(quantize_args(tmp_path, STORIES, TINYSTORIES, "--skip", "("), capsys)
    assert "nothing would be quantized" in run_error(quantize_args(tmp_path, STORIES, TINYSTORIES, "--skip", "."), capsys)
    assert not (tmp_path / ".out.resume").exists()
    assert "add --mse" in run_error(quantize_args(tmp_path, STORIES, TINYSTORIES, "--mse-weighted"), capsys)
    for flags in (["--mse", "--mse-weighted"], ["--refit-scales"]):
        err = run_error(quantize_args(tmp_path, STORIES, TINYSTORIES, "--method", "rtn", *flags), capsys)
        assert "RTN does not collect" in err
    assert not (tmp_path / "out").exists()
