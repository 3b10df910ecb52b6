"""CLI user experience: --help everywhere; bad input → one-line error, exit 2, no traceback, nothing written."""

import json
import re
import subprocess
import sys

import pytest

from matgptq.cli import main
from matgptq.errors import UserError
from matgptq.integrations.transformers import IMPORT_LOGGERS
from tests.conftest import STORIES, TINYSTORIES, make_tiny_llama


@pytest.mark.parametrize("cmd", [[], ["quantize"], ["eval"], ["slice"], ["export"], ["search"], ["verify"]])
def test_help_everywhere(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        main(cmd + ["--help"])
    assert e.value.code == 0
    assert "usage: matgptq" in capsys.readouterr().out


def quantize_args(tmp_path, model=STORIES, calib=TINYSTORIES, *extra):
    return [
        "quantize",
        str(model),
        "--out",
        str(tmp_path / "out"),
        "--calib",
        str(calib),
        "--nsamples",
        "2",
        "--seqlen",
        "32",
        "--quiet",
        *extra,
    ]


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


@pytest.mark.parametrize(
    "extra,mix,message",
    [
        (["--bits", "4"], {"*": 4}, "either --bits or --bits-config"),
        (["--method", "matgptq"], {"*": 4}, "already holds every width"),
        ([], {"*": 4, "model.layers.9.mlp.up_proj": 3}, "unknown layers"),
        ([], {"model.layers.0.mlp.up_proj": 3}, "misses 34 layers"),
        ([], {"*": 9}, "widths are 2..8"),
        ([], {"*": "4"}, "must be integers"),
    ],
)
def test_bad_width_mixes(tmp_path, capsys, extra, mix, message):
    (tmp_path / "mix.json").write_text(json.dumps(mix))
    args = quantize_args(tmp_path, STORIES, TINYSTORIES, "--bits-config", str(tmp_path / "mix.json"), *extra)
    assert message in run_error(args, capsys)
    assert not (tmp_path / "out").exists()


def test_a_mix_that_splits_a_fused_group_says_vllm_cannot_load_it(tmp_path, capsys):
    """quantize --bits-config names the first group vLLM runs as one layer (models/fused.py) given two widths; a mix
    with one width per group says so."""
    split = {"*": 4, "model.layers.1.self_attn.k_proj": 3}
    tied = {"*": 4, **{f"model.layers.1.self_attn.{p}_proj": 3 for p in "qkv"}}
    for name, mix in (("split", split), ("tied", tied)):
        (tmp_path / f"{name}.json").write_text(json.dumps(mix))
        args = [
            "quantize",
            str(STORIES),
            "--out",
            str(tmp_path / name),
            "--calib",
            str(TINYSTORIES),
            "--nsamples",
            "2",
            "--seqlen",
            "32",
            "--quiet",
            "--method",
            "rtn",
            "--bits-config",
            str(tmp_path / f"{name}.json"),
        ]
        assert main(args) == 0
        out = capsys.readouterr().out
        if name == "split":
            assert "note: model.layers.1.self_attn.{q_proj: 4, k_proj: 3, v_proj: 4} give layers vLLM runs" in out
        else:
            assert "has one width" in out and "note:" not in out


def test_missing_model_and_calibration(tmp_path, capsys):
    assert "no model found" in run_error(quantize_args(tmp_path, tmp_path / "nope"), capsys)
    assert "not found" in run_error(quantize_args(tmp_path, STORIES, tmp_path / "nope.txt"), capsys)
    empty = tmp_path / "empty.txt"
    empty.write_text("   \n")
    assert "no text" in run_error(quantize_args(tmp_path, STORIES, empty), capsys)
    short = tmp_path / "short.txt"
    short.write_text("Once upon a time.")
    err = run_error(quantize_args(tmp_path, STORIES, short), capsys)
    assert re.search(r"has \d+ tokens, fewer than the 64 that --nsamples 2 × --seqlen 32 ask for", err), err
    assert not (tmp_path / "out").exists()


def test_calibration_text_shorter_than_all_windows_refused(tmp_path, capsys):
    """More than one window of text but fewer tokens than --nsamples × --seqlen: refused, with the numbers and the fix
    (before, only text shorter than one window was)."""
    from matgptq.models import load_tokenizer

    text = TINYSTORIES.read_text(encoding="utf-8")[:100]
    n = len(load_tokenizer(STORIES)(text)["input_ids"])
    assert 32 < n < 2 * 32, n  # one window fits, two do not
    (tmp_path / "short.txt").write_text(text, encoding="utf-8")
    err = run_error(quantize_args(tmp_path, STORIES, tmp_path / "short.txt"), capsys)
    assert err == (
        f"matgptq: error: the calibration text has {n} tokens, fewer than the 64 that --nsamples 2 × "
        "--seqlen 32 ask for; give more text (or a wider --calib-range) or lower --nsamples/--seqlen\n"
    )
    assert not (tmp_path / "out").exists() and not (tmp_path / ".out.resume").exists()


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
    args = [
        "quantize",
        str(STORIES),
        "--out",
        str(out),
        "--method",
        "gptq",
        "--bits",
        "4",
        "--calib",
        str(TINYSTORIES),
        "--calib-range",
        "0.6:1",
        "--nsamples",
        "16",
        "--seqlen",
        "128",
        "--quiet",
    ]
    assert main(args) == 0
    assert "wrote" in capsys.readouterr().out
    js = tmp_path / "eval.json"
    assert (
        main(
            [
                "eval",
                str(out),
                "--text",
                str(TINYSTORIES),
                "--text-range",
                "0:0.6",
                "--max-tokens",
                "4096",
                "--kl-to",
                str(STORIES),
                "--json",
                str(js),
            ]
        )
        == 0
    )
    import json

    row = json.loads(js.read_text())["results"][0]
    assert 4.0 < row["ppl"] < 6.0 and row["kl"] > 0 and row["tokens"] == 4096


def test_signed_scale_and_skip_validation(tmp_path, capsys):
    assert "symmetric grid" in run_error(
        quantize_args(tmp_path, STORIES, TINYSTORIES, "--asym", "--signed-scale"), capsys
    )
    assert "not a valid regular expression" in run_error(
        quantize_args(tmp_path, STORIES, TINYSTORIES, "--skip", "("), capsys
    )
    assert "nothing would be quantized" in run_error(
        quantize_args(tmp_path, STORIES, TINYSTORIES, "--skip", "."), capsys
    )
    assert not (tmp_path / ".out.resume").exists()
    assert "drop --no-mse" in run_error(
        quantize_args(tmp_path, STORIES, TINYSTORIES, "--no-mse", "--mse-weighted"), capsys
    )
    for flags in (["--mse", "--mse-weighted"], ["--refit-scales"]):
        err = run_error(quantize_args(tmp_path, STORIES, TINYSTORIES, "--method", "rtn", *flags), capsys)
        assert "RTN does not collect" in err
    assert not (tmp_path / "out").exists()


def test_ctrl_c_after_a_block_says_how_to_resume(tmp_path, capsys, monkeypatch):
    """Ctrl-C once a block is finished: the resume state is kept and the message says so (on a line of its own after
    the progress bar), exit 130; the command it names then finishes the run."""
    from matgptq.quantization.resume import BlockState

    save = BlockState.save

    def save_then_interrupt(self, *args):
        save(self, *args)
        raise KeyboardInterrupt

    monkeypatch.setattr(BlockState, "save", save_then_interrupt)
    args = [a for a in quantize_args(tmp_path) if a != "--quiet"]  # with its progress bar
    assert main(args) == 130
    err = capsys.readouterr().err
    resume = tmp_path / ".out.resume"
    assert "quantize" in err.split("\n")[-3]  # the bar, ended
    assert err.split("\n")[-2:] == [
        f"matgptq: interrupted; the progress is kept in {resume}; run the same command with --resume to continue",
        "",
    ]
    assert (resume / "state.json").is_file() and not (tmp_path / "out").exists()
    monkeypatch.undo()
    assert main([*args, "--resume"]) == 0
    assert (tmp_path / "out" / "matgptq.json").is_file() and not resume.exists()


def test_ctrl_c_before_any_block_wrote_nothing(tmp_path, capsys, monkeypatch):
    from matgptq.quantization import pipeline

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "_solve", interrupt)
    assert main(quantize_args(tmp_path)) == 130
    assert capsys.readouterr().err == "matgptq: interrupted; nothing was written\n"
    assert list(tmp_path.iterdir()) == []


def test_error_during_a_progress_bar_starts_its_own_line(tmp_path, capsys, monkeypatch):
    """stderr is not a terminal here (as in a log file): the bar's line ends before the error, and nothing of the bar
    is printed after it."""
    import gc

    from matgptq.quantization import pipeline

    solve, calls = pipeline._solve, []

    def fail_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise UserError("the solver failed (test)")
        return solve(*args, **kwargs)

    monkeypatch.setattr(pipeline, "_solve", fail_third)
    assert main([a for a in quantize_args(tmp_path) if a != "--quiet"]) == 2
    gc.collect()  # a bar left open would print itself when collected
    err = capsys.readouterr().err
    lines = err.split("\n")
    assert lines[-2:] == ["matgptq: error: the solver failed (test)", ""] and "quantize" in lines[-3], err
    assert err.count("matgptq: error") == 1


@pytest.mark.parametrize("cmd", ["quantize", "eval", "slice", "export", "search", "verify"])
def test_help_shows_every_default(cmd, capsys, monkeypatch):
    """Each option with a default says it in --help; flags and options without one (None, [], SUPPRESS) get no
    "(default: None)" noise."""
    import argparse

    from matgptq.cli import build_parser

    monkeypatch.setenv("COLUMNS", "1000")  # one line per option's help: no wrapping inside a value
    with pytest.raises(SystemExit):
        main([cmd, "--help"])
    text = capsys.readouterr().out
    entries: list[str] = []  # each option's invocation and help
    for line in text.split("\n"):
        if re.match(r"  -", line):
            entries.append(line)
        elif entries and line.startswith("   "):
            entries[-1] += line
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[cmd]
    checked = 0
    for action in sub._actions:
        d = action.default
        if not action.option_strings or action.nargs == 0 or d is None or d is argparse.SUPPRESS or d == []:
            continue
        opt = action.option_strings[-1]
        entry = next(e for e in entries if re.match(rf"\s+(-\w, )?{re.escape(opt)}(?=[ ,]|$)", e))
        shown = {str(d)} | ({f"{d:g}"} if isinstance(d, float) else set())
        assert any(re.search(rf"default:? {re.escape(s)}\b", entry) for s in shown), entry
        checked += 1
    assert checked >= {"quantize": 10, "eval": 3, "slice": 0, "export": 3, "search": 10, "verify": 0}[cmd]
    assert not re.search(r"default: (None|False|True|\[\])", text)


def test_third_party_warnings_are_silenced_matgptq_ones_are_not(tmp_path, monkeypatch, recwarn):
    """A peer library that warns when imported and used inside a command is silent, and so are the peer loggers
    (torchao's, torch's pytree); a warning from a matgptq module still shows; afterwards the caller's warning filters
    and logger levels are as they were."""
    import logging
    import types
    import warnings

    from matgptq import cli

    (tmp_path / "fake_peer.py").write_text(
        "import warnings\nwarnings.warn('peer: deprecated at import', FutureWarning)\n\ndef use():\n"
        "    for c in (DeprecationWarning, FutureWarning, UserWarning):\n"
        "        warnings.warn(f'peer: {c.__name__}', c)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fake_peer", raising=False)
    monkeypatch.setattr(sys, "warnoptions", [])  # no -W / PYTHONWARNINGS from whoever runs the tests
    ours = types.ModuleType("matgptq._fake_warner")  # a module of the package: its warnings are the user's
    exec(
        "import warnings\ndef warn():\n    warnings.warn('matgptq: a warning of our own', UserWarning)\n", ours.__dict__
    )
    logged: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    loggers = [logging.getLogger(name) for name in IMPORT_LOGGERS]

    def command(args):
        __import__("fake_peer").use()
        ours.warn()
        for logger in loggers:
            logger.warning(f"{logger.name}: a note")
            logger.error(f"{logger.name}: an error")

    monkeypatch.setattr(cli.COMMANDS["slice"], "run", command)
    filters, levels = list(warnings.filters), [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        assert main(["slice", "parent", "--bits", "3", "--out", str(tmp_path / "o")]) == 0
        assert [str(w.message) for w in recwarn] == ["matgptq: a warning of our own"]
        assert logged == [f"{logger.name}: an error" for logger in loggers]
        assert warnings.filters == filters and [logger.level for logger in loggers] == levels
        sys.modules["fake_peer"].use()  # outside a command nothing is hidden
        loggers[0].warning("after")
        assert len(recwarn) == 4 and logged[-1] == "after"
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def test_a_command_prints_no_peer_notes(tmp_path):
    """The real case, in a fresh process: transformers imports torchao (when installed) while the model loads; its
    notes and the pytree deprecations it causes, printed by `import transformers.modeling_utils` alone, are not."""
    import importlib.util

    if importlib.util.find_spec("torchao") is None:
        pytest.skip("torchao is not installed: nothing to silence")
    control = subprocess.run(
        [sys.executable, "-c", "import transformers.modeling_utils"], capture_output=True, text=True
    )
    assert "torchao" in control.stderr or "register_constant" in control.stderr, control.stderr  # the noise exists
    cmd = [
        sys.executable,
        "-m",
        "matgptq",
        "quantize",
        str(STORIES),
        "--method",
        "rtn",
        "--out",
        str(tmp_path / "q"),
        "--quiet",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_our_warnings_are_one_line_of_our_own(tmp_path):
    """A matgptq warning reaches the user as `matgptq: warning: ...`, one line, not Python's file:line and source excerpt
    (stories260K's 172-wide MLP does not fill whole int32 words at 4 bits, so the GPTQ export warns that it pads)."""
    base = [sys.executable, "-m", "matgptq"]
    q = subprocess.run(
        [*base, "quantize", str(STORIES), "--method", "rtn", "--out", str(tmp_path / "q"), "--quiet"],
        capture_output=True,
        text=True,
    )
    assert q.returncode == 0, q.stderr
    r = subprocess.run(
        [*base, "export", str(tmp_path / "q"), "--format", "gptq_v2", "--out", str(tmp_path / "g")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("matgptq: warning: 15 layer(s) have features that do not fill"), (
        lines
    )
