"""`matgptq search` end to end: the mix files load, evaluate and export as they are; bad input is one line, exit 2,
nothing written."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import pytest
import torch

import matgptq
from matgptq.allocation import EvoConfig, parse_stages
from matgptq.allocation.sensitivity import Sensitivity
from matgptq.cli import main
from matgptq.execution import native_bfloat16
from tests.conftest import STORIES, TINYSTORIES
from tests.test_cli import run_error

QUICK = [
    "--calib",
    str(TINYSTORIES),
    "--calib-range",
    "0.6:0.7",
    "--levels",
    "2,4,8",
    "--generations",
    "2",
    "--offspring",
    "4",
    "--stages",
    "126:2,504:1",
    "--seqlen",
    "64",
    "--sensitivity-tokens",
    "126",
    "--quiet",
]


BASELINES = ("--baselines", "uniform,error,gradient")  # the three the search ran before baselines were opt-in


def search(parent, out, *extra):
    return ["search", str(parent), "--out", str(out), *QUICK, *extra]


@pytest.fixture(scope="module")
def searched(stories_parent, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "mixes"
    assert (
        main(
            search(
                stories_parent,
                out,
                "--budget",
                "3.0,2.5",
                "--text",
                str(TINYSTORIES),
                "--text-range",
                "0:0.01",
                "--seqlen",
                "64",
                "--plot",
                *BASELINES,
            )
        )
        == 0
    )
    return out


def test_mix_files_are_read_by_load_eval_and_export(searched, stories_parent, tmp_path, capsys):
    for budget in ("3.0", "2.5"):
        mix = json.loads((searched / f"mix-{budget}.json").read_text())
        assert mix["summary"]["code_bits"] <= float(budget) and set(mix["bits"].values()) <= {2, 4, 8}
        model = matgptq.load(stories_parent, bits=searched / f"mix-{budget}.json")
        assert model.matgptq.bits == mix["bits"]
    path = searched / "mix-2.5.json"
    assert (
        main(["eval", str(stories_parent), "--bits", str(path), "--text", str(TINYSTORIES), "--text-range", "0:0.01"])
        == 0
    )
    assert "mix" in capsys.readouterr().out
    out = tmp_path / "gptq"
    assert (
        main(["export", str(stories_parent), "--format", "gptq_v2", "--bits-config", str(path), "--out", str(out)]) == 0
    )
    exported = matgptq.load(out)
    reference = matgptq.load(stories_parent, bits=path)
    name = next(iter(mix["bits"]))
    assert torch.equal(
        exported.get_submodule(name).weight.data.float(), reference.get_submodule(name).weight.data.float()
    )
    # and as GGUF, each layer in the block type of its own width, read back by gguf-py
    from matgptq.formats.gguf import read_gguf_weights

    assert (
        main(
            [
                "export",
                str(stories_parent),
                "--format",
                "gguf",
                "--bits-config",
                str(path),
                "--out",
                str(tmp_path / "mix.gguf"),
            ]
        )
        == 0
    )
    weights = read_gguf_weights(tmp_path / "mix.gguf")
    for name in mix["bits"]:
        if name.endswith(("up_proj", "gate_proj", "o_proj", "v_proj")):  # 64 columns: whole Q4_0/Q8_0 blocks, exact
            assert torch.equal(
                torch.from_numpy(weights[f"{name}.weight"]), reference.get_submodule(name).weight.data
            ), name


def test_the_written_mix_is_the_candidate_with_the_lowest_calibration_kl(searched, stories_parent):
    """The search's output is the lowest of its knapsack mix, its one-shot start, that start refined and its evolved
    mix on the whole calibration pool. Oracle: each candidate re-scored by `evaluation.perplexity.score` (log-softmax KL, not the fitness's
    decomposition) on the pool rebuilt here from the same text, range and window length.
    Tolerance: both sides run the same float32 forward of the same weights; they differ only in batching and in how
    the KL is summed. A float32 log-softmax of logits |z| ≲ 30 is off by ≲ 2⁻²³·30 ≈ 4e-6 per entry, so the mean KL
    per token by ≲ 1e-5 (p sums to 1); 1e-4 leaves a 10× margin. Candidates closer than 2·tol count as a tie."""
    from matgptq.evaluation.perplexity import Teacher, score
    from matgptq.models import load_tokenizer, read_text, tokenize

    tol = 1e-4
    n = -(-16384 // 63)  # the default 16,384-token pool in 64-token windows (63 predicted tokens each)
    pool = tokenize(load_tokenizer(stories_parent), read_text(TINYSTORIES, (0.6, 0.7)))[: n * 64].view(n, 64)
    with Teacher(matgptq.load(STORIES), pool, 32) as teacher:
        for budget in ("3.0", "2.5"):
            mix = json.loads((searched / f"mix-{budget}.json").read_text())
            s = mix["summary"]
            candidates = {
                "search": (mix["search_bits"], s["search_kl"]),
                "refined": (mix["start_bits"], s["start_kl"]),
                "knapsack": (mix["dp_bits"], s["dp_kl"]),
                s["start"]: (mix["baseline_bits"][s["start"]], s["baseline_kl"][s["start"]]),
            }
            assert candidates[s["chosen"]] == (mix["bits"], s["kl"])
            assert s["kl"] == min(kl for _, kl in candidates.values())
            assert s["uniform_gap"]["shown"]  # the 2-bit slice (--levels 2,4,8) is far behind at 2.5 and 3 bits
            oracle = {}
            for name, (bits, kl) in candidates.items():
                oracle[name] = score(matgptq.load(stories_parent, bits=bits), pool, teacher, 32).kl
                assert abs(oracle[name] - kl) <= tol, (budget, name, oracle[name], kl)
            assert oracle[s["chosen"]] <= min(oracle.values()) + 2 * tol


def test_a_gguf_budget_is_kept_by_the_file_export_writes(stories_parent, tmp_path):
    """`--budget-kind gguf`: the mix's GGUF bits, counted independently from the tensors gguf-py reads back from
    the file `export` writes, stay within the budget (halfway between the lowest and the highest level's size)."""
    from gguf import GGUFReader

    from matgptq.allocation import BudgetKind, CostModel
    from matgptq.formats import read_checkpoint

    cost = CostModel.from_checkpoint(read_checkpoint(stories_parent), (2, 4, 8), gguf=True)
    lo, hi = (cost.average(tuple(r for _ in cost.names), BudgetKind.GGUF) for r in (2, 8))
    budget = f"{(lo + hi) / 2:.3f}"
    assert main(search(stories_parent, tmp_path / "mixes", "--budget", budget, "--budget-kind", "gguf")) == 0
    mix_file = tmp_path / "mixes" / f"mix-{budget}.json"
    assert (
        main(
            [
                "export",
                str(stories_parent),
                "--format",
                "gguf",
                "--bits-config",
                str(mix_file),
                "--out",
                str(tmp_path / "m.gguf"),
            ]
        )
        == 0
    )
    layer_bytes = sum(
        int(t.n_bytes)
        for t in GGUFReader(tmp_path / "m.gguf").tensors
        if t.name.startswith("blk.") and "norm" not in t.name
    )
    summary = json.loads(mix_file.read_text())["summary"]
    assert 8 * layer_bytes == round(summary["gguf_bits"] * cost.total_weights)
    assert 8 * layer_bytes <= float(budget) * cost.total_weights


def test_resume_of_a_finished_search_rewrites_the_same_mix(searched, stories_parent):
    before = json.loads((searched / "mix-3.0.json").read_text())["bits"]
    assert main(search(stories_parent, searched, "--budget", "3.0", "--resume", *BASELINES)) == 0
    assert json.loads((searched / "mix-3.0.json").read_text())["bits"] == before


def test_a_search_killed_with_sigkill_resumes_to_the_same_mix(stories_parent, tmp_path):
    """`kill -9` between generations (the state is written atomically after each), then --resume: the same mix as an
    uninterrupted run with the same seed."""
    args = ["--budget", "3.0", "--generations", "24"]
    assert main(search(stories_parent, tmp_path / "whole", *args)) == 0
    killed = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "matgptq", *search(stories_parent, killed, *args)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    state, generation = killed / ".state-3.0.json", 0
    deadline = time.monotonic() + 300
    while generation < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
        generation = json.loads(state.read_text())["state"]["generation"] if state.exists() else 0
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the search ended before it could be killed"
    assert 2 <= json.loads(state.read_text())["state"]["generation"] < 24 and not (killed / "mix-3.0.json").exists()
    assert main(search(stories_parent, killed, *args, "--resume")) == 0
    bits = lambda d: json.loads((d / "mix-3.0.json").read_text())["bits"]  # noqa: E731
    assert bits(killed) == bits(tmp_path / "whole")


def test_bad_input(searched, stories_parent, tmp_path, capsys):
    out = tmp_path / "none"
    other_dtype = "float32" if native_bfloat16(torch.device("cpu")) else "bfloat16"  # not what auto resolved to
    cases = [
        (search(stories_parent, out, "--budget", "1.5"), "below what the lowest level 2"),
        (search(stories_parent, out, "--budget", "8.5"), "above what the highest level 8"),
        (search(stories_parent, out, "--budget", "3", "--levels", "2,9"), "not a width of this parent"),
        (search(STORIES, out, "--budget", "3"), "not a matgptq parent"),
        (search(stories_parent, out, "--budget", "3", "--calib-range", "0.6:0.6005"), "the search needs"),
        (search(stories_parent, out, "--budget", "3", "--stages", "504:1,126:1"), "non-decreasing"),
        (search(stories_parent, out, "--budget", "3", "--time-limit", "0"), "positive number of minutes"),
        (search(stories_parent, out, "--budget", "3", "--sensitivity-top", "8"), "not a level below the top one"),
        (
            search(stories_parent, out, "--budget", "3", "--levels", "2,3,4", "--sensitivity-top", "6"),
            "levels are 2, 3, 4",
        ),
        (
            search(stories_parent, out, "--budget", "3", "--sensitivity", "probe", "--sensitivity-top", "4"),
            "probe scores one level",
        ),
        (search(stories_parent, out, "--budget", "3", "--sensitivity-wide", "8:252"), "not a level below the top one"),
        (search(stories_parent, out, "--budget", "3", "--sensitivity-wide", "4:0"), "the tokens must be ≥ 1"),
        (
            search(stories_parent, out, "--budget", "3", "--sensitivity", "probe", "--sensitivity-wide", "4:252"),
            "probe scores one level",
        ),
        (
            search(
                stories_parent,
                out,
                "--budget",
                "3",
                "--calib-range",
                "0.6:0.61",
                "--calib-tokens",
                "126",
                "--sensitivity-wide",
                "4:100000",
            ),
            "--sensitivity-wide",
        ),
        (search(stories_parent, searched, "--budget", "3.0"), "--overwrite"),
        (search(stories_parent, searched, "--budget", "3.0", "--resume", "--seed", "7"), "other settings"),
        (
            search(stories_parent, searched, "--budget", "3.0", "--resume", "--sensitivity-wide", "4:252"),
            "other settings",
        ),
        (search(stories_parent, searched, "--budget", "3.0", "--resume", "--score-dtype", other_dtype), "score_dtype"),
    ]
    for args, message in cases:
        assert message in run_error(args, capsys), args
    with pytest.raises(SystemExit) as usage:  # argparse's own usage error
        main(search(stories_parent, out, "--budget", "3", "--sensitivity-wide", "4"))
    assert usage.value.code == 2 and "expected LEVEL:TOKENS such as 4:510, got '4'" in capsys.readouterr().err
    assert not out.exists()
    bad_mix = tmp_path / "bad.json"
    bad_mix.write_text(json.dumps({"bits": {"model.layers.9.mlp.up_proj": 3, "*": 4}}))
    assert "unknown layers" in run_error(
        ["eval", str(stories_parent), "--bits", str(bad_mix), "--text", str(TINYSTORIES)], capsys
    )


def test_a_slice_has_no_levels(stories_parent, tmp_path, capsys):
    sliced = tmp_path / "slice3"
    assert main(["slice", str(stories_parent), "--bits", "3", "--out", str(sliced)]) == 0
    assert "a slice" in run_error(search(sliced, tmp_path / "o", "--budget", "3"), capsys)


def test_ctrl_c_keeps_the_search_state_and_says_how_to_resume(stories_parent, tmp_path, capsys, monkeypatch):
    """Ctrl-C after a generation's state is written: exit 130, the message names the state and --resume, and that
    command then writes the mix."""
    from matgptq.allocation import evopress

    write_state = evopress.write_state

    def write_then_interrupt(*args):
        write_state(*args)
        raise KeyboardInterrupt

    monkeypatch.setattr(evopress, "write_state", write_then_interrupt)
    args = search(stories_parent, tmp_path / "mixes", "--budget", "3.0")
    assert main(args) == 130
    state = tmp_path / "mixes" / ".state-3.0.json"
    assert capsys.readouterr().err == (
        f"matgptq: interrupted; the progress is kept in {state}; run the same command with --resume to continue\n"
    )
    assert json.loads(state.read_text())["state"]["generation"] == 1
    assert not (tmp_path / "mixes" / "mix-3.0.json").exists()
    monkeypatch.undo()
    assert main([*args, "--resume"]) == 0
    assert (tmp_path / "mixes" / "mix-3.0.json").is_file()


def test_too_little_calibration_text_names_the_numbers(stories_parent, tmp_path, capsys):
    """The search's pool: the text's token count, what the binding option asks for, and which option to lower."""
    args = search(stories_parent, tmp_path / "none", "--budget", "3", "--calib-range", "0.6:0.6005")
    err = run_error(args, capsys)
    # QUICK: --seqlen 64 and the default --calib-tokens 16384 (above --sensitivity-tokens 126 and the last stage's 504)
    pattern = (
        r"the calibration text \(.*tinystories_val_head\.txt, --calib-range 0\.6:0\.6005\) has \d+ tokens, "
        r"fewer than the 16,704 the search needs for --calib-tokens 16384 \(261 windows of --seqlen 64, 63 "
        r"scored tokens each\); give more text \(or a wider --calib-range\) or lower --calib-tokens"
    )
    assert re.search(pattern, err), err
    err = run_error([*args, "--calib-tokens", "100", "--sensitivity-tokens", "200"], capsys)
    assert "needs for --stages 126:2,504:1 (8 windows" in err and err.strip().endswith("lower --stages")
    assert not (tmp_path / "none").exists()


def test_the_written_mix_is_the_best_candidate(searched):
    """Every one-shot allocation (the knapsack start and the --baselines given: the uniform slice, the imatrix-weighted
    error, the first-order raise), the refined start and the evolved mix are scored on the whole calibration pool; the written mix is
    the lowest of them, or the uniform slice where that is not shown better, and each allocation's widths are in the
    file beside its score."""
    for budget in ("3.0", "2.5"):
        mix = json.loads((searched / f"mix-{budget}.json").read_text())
        s = mix["summary"]
        assert {"knapsack", "error", "gradient"} <= set(s["baseline_kl"])
        assert any(k.startswith("uniform ") for k in s["baseline_kl"])
        assert set(mix["baseline_bits"]) == set(s["baseline_kl"]) and mix["baseline_bits"]["knapsack"] == mix["dp_bits"]
        assert s["baseline_kl"]["knapsack"] == s["dp_kl"]
        lowest = min([s["search_kl"], s["start_kl"], *s["baseline_kl"].values()])
        gap = s["uniform_gap"]  # the lowest against the uniform slice, window by window (test_choice.py)
        assert gap["shown"] == (gap["mean"] + 2 * gap["se"] < 0)
        assert s["kl"] == (lowest if gap["shown"] else s["baseline_kl"][gap["against"]])
        own = {"search": s["search_kl"], "refined": s["start_kl"]}  # the evolved mix, its start (the refined one)
        assert s["kl"] == own.get(s["chosen"], s["baseline_kl"].get(s["chosen"]))
        # the start's table beside the widths: every layer, every level, the top level the unchanged parent's KL;
        # by default every level below the top measured (--sensitivity full), none extrapolated
        assert mix["settings"]["sensitivity"] == "full" and s["sensitivity_levels"] == [2, 4]
        assert set(mix["sensitivity"]) == set(mix["bits"])
        assert all(set(v) == {"2", "4", "8"} for v in mix["sensitivity"].values())
        assert len({v["8"] for v in mix["sensitivity"].values()}) == 1
        if s["chosen"] == "search":
            assert mix["bits"] == mix["search_bits"]
        elif s["chosen"] == "knapsack":
            assert mix["bits"] == mix["dp_bits"]


def test_the_gradient_baseline_raises_layers_from_the_uniform_slice(searched):
    """With --levels 2,4,8 the 2.5- and 3.0-bit budgets sit above the uniform 2-bit slice, and the first-order
    allocation (--baselines gradient) raises layers from it within the budget; the file holds its widths and its
    score."""
    for budget in ("3.0", "2.5"):
        mix = json.loads((searched / f"mix-{budget}.json").read_text())
        gradient, uniform = mix["baseline_bits"]["gradient"], mix["baseline_bits"]["uniform 2"]
        assert set(uniform.values()) == {2} and gradient != uniform and min(gradient.values()) == 2
        assert "gradient" in mix["summary"]["baseline_kl"] and mix["summary"]["code_bits"] <= float(budget)


def test_the_plot_shows_each_width_against_its_sensitivity(searched):
    """--plot: a PNG beside each mix file, drawn from the file's widths and the start's table (plot.series)."""
    from matgptq.allocation.plot import series

    for budget in ("3.0", "2.5"):
        mix = json.loads((searched / f"mix-{budget}.json").read_text())
        assert (searched / f"mix-{budget}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        names, widths, delta = series(mix)
        assert names == list(mix["bits"]) and widths == [mix["bits"][n] for n in names]
        assert delta == [mix["sensitivity"][n]["2"] - mix["sensitivity"][n]["8"] for n in names]


def test_a_spent_time_limit_still_writes_every_budget_its_uniform_slice(stories_parent, tmp_path):
    """A limit already spent when the run begins (one minute, all of it `time_spent` before, as the command counts
    its process's start-up) leaves no time for the table's lowest width nor any scoring: every budget still gets its
    mix file, the budget's uniform slice (oracle: the widest width whose uniform mix fits, from the cost model), with
    no generation, its KLs unscored (None) and `cut` naming what was left out; the file loads. Without a limit the
    same settings run every generation and score every level."""
    from matgptq.allocation import BudgetKind, CostModel
    from matgptq.formats import read_checkpoint

    cost = CostModel.from_checkpoint(read_checkpoint(stories_parent), (2, 4, 8))
    rows = matgptq.search(
        stories_parent,
        "3.0,2.5",
        TINYSTORIES,
        tmp_path / "limited",
        calib_range=(0.6, 0.7),
        levels=(2, 4, 8),
        seqlen=64,
        sensitivity_tokens=126,
        progress=False,
        time_limit=1.0,
        time_spent=60.0,
        sensitivity=Sensitivity.FULL,
        evo=EvoConfig(generations=3, offspring=4, stages=parse_stages("126:2,504:1")),
    )
    assert [r["generations"] for r in rows] == [0, 0] and [r["sensitivity_levels"] for r in rows] == [[], []]
    for r in rows:
        mix = json.loads((tmp_path / "limited" / f"mix-{r['budget']}.json").read_text())
        widest = max(w for w in (2, 4, 8) if cost.fits((w,) * len(cost.names), Fraction(r["budget"]), BudgetKind.CODE))
        assert set(mix["bits"].values()) == {widest} and mix["summary"]["chosen"] == "search"
        assert mix["summary"]["kl"] is None and mix["summary"]["time_limit"] == 1.0
        assert "the start's table (the uniform slice instead)" in mix["summary"]["cut"]
        assert "report_guess_seconds" not in mix["summary"]
        assert (
            matgptq.load(stories_parent, bits=tmp_path / "limited" / f"mix-{r['budget']}.json").matgptq.bits
            == mix["bits"]
        )
    args = ["--budget", "3.0,2.5", "--generations", "3", "--sensitivity", "full"]
    assert main(search(stories_parent, tmp_path / "free", *args)) == 0
    for budget in ("3.0", "2.5"):
        summary = json.loads((tmp_path / "free" / f"mix-{budget}.json").read_text())["summary"]
        assert summary["generations"] == 3 and summary["sensitivity_levels"] == [2, 4] and summary["cut"] == []


def test_wide_levels_are_scored_on_their_windows_and_recorded(stories_parent, tmp_path):
    """--sensitivity-wide 4:252 on levels 2, 4, 8: both levels below the top are scored (4 on the four windows of
    252 tokens, 2 on the two of --sensitivity-tokens 126), and every mix file's settings carry the option, so a
    resume with other windows is refused (test_bad_input)."""
    assert main(search(stories_parent, tmp_path / "wide", "--budget", "3.0,2.5", "--sensitivity-wide", "4:252")) == 0
    for budget in ("3.0", "2.5"):
        mix = json.loads((tmp_path / "wide" / f"mix-{budget}.json").read_text())
        assert mix["summary"]["sensitivity_levels"] == [2, 4]
        assert mix["settings"]["sensitivity_wide"] == [4, 252] and mix["settings"]["sensitivity_tokens"] == 126
