"""`matgptq eval --tasks`: zero-shot accuracy through lm-eval on local JSONL files.

Oracles: lm-eval's own `hf` model path (it loads the directory itself) on the same task configs and files gives the
same accuracies; a width scored from a parent after `set_bits` equals that width loaded on its own (a `matgptq slice`
checkpoint, or `load(parent, bits=r)` fresh); and a scorer written here from the definition (log-likelihood of
" " + choice after the query, summed over the choice's tokens) picks the same answers. Accuracies are counts over the
same questions, so they are compared exactly.
"""

import contextlib
import json
import math
import shutil

import pytest
import torch

import matgptq
from matgptq.cli import main
from matgptq.errors import UserError
from matgptq.evaluation.tasks import (
    SHAPES,
    TaskSpec,
    check_answers_fit,
    resolve_tasks,
    run_lm_eval,
    score_tasks,
    task_config,
    wrap_model,
)
from matgptq.models import load_tokenizer
from tests.conftest import REAL_MODEL, SHARED, STORIES, quick_quantize, require_peer

ZERO_SHOT = SHARED / "data" / "zero-shot"
TASKS = "arc_easy,piqa,wino"
N = 12  # questions per task file: enough for accuracies to differ between widths, fast on a tiny model
WINO = [  # Winogrande-style: the options are contexts, the continuation is fixed
    (["The cat chased the dog because the cat", "The cat chased the dog because the dog"], "was hungry.", 0),
    (["Tim gave Sam a ball since Tim", "Tim gave Sam a ball since Sam"], "had two of them.", 0),
    (
        ["The cup fell off the table because the cup", "The cup fell off the table because the table"],
        "was slippery.",
        0,
    ),
    (["Lily could not lift the box because Lily", "Lily could not lift the box because the box"], "was too heavy.", 1),
    (["The sun melted the snow, so the sun", "The sun melted the snow, so the snow"], "was gone by noon.", 1),
    (["Mom baked a cake for Ben because Mom", "Mom baked a cake for Ben because Ben"], "was turning five.", 1),
    (["The bird sang to the girl until the bird", "The bird sang to the girl until the girl"], "fell asleep.", 1),
    (["The boat was faster than the car, so the boat", "The boat was faster than the car, so the car"], "won.", 0),
]


@pytest.fixture(scope="module")
def lm_eval():
    return require_peer("lm_eval")


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("zero-shot")
    for name in ("arc_easy", "piqa"):
        lines = (ZERO_SHOT / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()[:N]
        (d / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    wino = [json.dumps({"context_options": c, "continuation": t, "gold": g}) for c, t, g in WINO]
    (d / "wino.jsonl").write_text("\n".join(wino) + "\n", encoding="utf-8")
    return d


@pytest.fixture(scope="module")
def parent(tiny_bpe_llama_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("zs") / "parent"
    return quick_quantize(tiny_bpe_llama_dir, out, method="matgptq", bits=(3, 4, 8), group_size=32)


def cli_scores(args, tmp_path, name="eval.json") -> dict[tuple[str, str], dict]:
    js = tmp_path / name
    assert main(["eval", *map(str, args), "--json", str(js)]) == 0
    return {(r["bits"], r["task"]): r for r in json.loads(js.read_text())["task_results"]}


def test_task_files_are_read_in_both_shapes(tasks_dir):
    specs = resolve_tasks(TASKS, tasks_dir)
    assert [(s.name, s.shape, s.size) for s in specs] == [
        ("arc_easy", "choices", N),
        ("piqa", "choices", N),
        ("wino", "context_options", len(WINO)),
    ]
    config = task_config(specs[2])
    assert config["task"] == "wino" and config["dataset_kwargs"]["data_files"]["test"] == str(specs[2].path)
    # lm-eval's Winogrande convention: doc_to_text gives the gold index, the options are contexts
    assert (config["doc_to_text"], config["doc_to_choice"], config["doc_to_target"]) == (
        "gold",
        "context_options",
        "continuation",
    )
    assert set(SHAPES["context_options"]) == {"gold", "context_options", "continuation"}


def test_fp_model_equals_lm_evals_own_hf_path(lm_eval, tiny_bpe_llama_dir, tasks_dir, tmp_path):
    """Our scoring of the object `matgptq.load` returns = lm-eval loading the directory itself ("hf", pretrained=dir)."""
    ours = cli_scores(
        [tiny_bpe_llama_dir, "--tasks", TASKS, "--tasks-dir", tasks_dir, "--task-batch-size", 4], tmp_path
    )
    specs = resolve_tasks(TASKS, tasks_dir)
    theirs = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={tiny_bpe_llama_dir},dtype=float32,device=cpu",
        batch_size=4,
        tasks=[task_config(s) for s in specs],
        bootstrap_iters=0,
        task_manager=lm_eval.tasks.TaskManager(include_defaults=False),
    )
    for s in specs:
        for metric in (
            ("acc", "acc_norm") if s.shape == "choices" else ("acc",)
        ):  # context_options: lm-eval has acc only
            assert ours[("fp", s.name)][metric] == theirs["results"][s.name][f"{metric},none"], (s.name, metric)
        assert ours[("fp", s.name)]["n"] == theirs["n-samples"][s.name]["effective"] == s.size
    mean = sum(ours[("fp", s.name)]["acc"] for s in specs) / len(specs)
    assert ours[("fp", "average")]["acc"] == pytest.approx(mean, rel=1e-15)


def _loglikelihood(model, tokenizer, context: str, continuation: str) -> float:
    """log p(continuation | context) as lm-eval defines it: encode context+continuation and the context alone; the
    continuation's tokens are those after the context's (trailing whitespace of the context, e.g. PIQA's "\\n", moves
    to the continuation)."""
    n_space = len(context) - len(context.rstrip())
    context, continuation = context[: len(context) - n_space], context[len(context) - n_space :] + continuation
    whole = tokenizer(context + continuation, add_special_tokens=False)["input_ids"]
    n_ctx = len(tokenizer(context, add_special_tokens=False)["input_ids"])
    ids = torch.tensor([whole])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, :-1].double(), -1)
    return sum(logp[t - 1, whole[t]].item() for t in range(n_ctx, len(whole)))


def test_scores_match_the_definition(lm_eval, tiny_bpe_llama_dir, tasks_dir):
    """acc / acc_norm from the definition, computed here one question at a time in float64 log-softmax."""
    model, tokenizer = matgptq.load(tiny_bpe_llama_dir), load_tokenizer(tiny_bpe_llama_dir)
    specs = resolve_tasks(TASKS, tasks_dir)
    scores = score_tasks(wrap_model(model, tokenizer, batch_size=4), specs)
    for s in specs:
        acc = acc_norm = 0
        for line in s.path.read_text(encoding="utf-8").splitlines():
            doc = json.loads(line)
            if s.shape == "choices":
                pairs = [(doc["query"], " " + c) for c in doc["choices"]]
                lengths = [len(c) for c in doc["choices"]]  # per character of the choice, the " " not counted
            else:  # the same continuation after every option: normalising by its length cannot change the answer
                pairs = [(c, " " + doc["continuation"]) for c in doc["context_options"]]
                lengths = [1] * len(pairs)
            lls = [_loglikelihood(model, tokenizer, ctx, cont) for ctx, cont in pairs]
            # lm-eval sums float32 log-softmax values: answers are exact only away from ties (float32 noise ~1e-5)
            for values in (lls, [ll / n for ll, n in zip(lls, lengths)]):
                top = sorted(values, reverse=True)
                assert top[0] - top[1] > 1e-4, f"near tie in {s.name}: {values}"
            acc += max(range(len(lls)), key=lls.__getitem__) == doc["gold"]
            acc_norm += max(range(len(lls)), key=lambda i: lls[i] / lengths[i]) == doc["gold"]
        assert (round(scores[s.name]["acc"] * s.size), round(scores[s.name]["acc_norm"] * s.size)) == (acc, acc_norm)


@pytest.fixture(scope="module")
def stories_parent(tmp_path_factory):
    out = tmp_path_factory.mktemp("zs") / "stories-parent"
    return quick_quantize(STORIES, out, method="matgptq", bits=(3, 4, 8))


def test_widths_from_one_parent_equal_widths_loaded_alone(lm_eval, stories_parent, tasks_dir, tmp_path):
    """eval --bits 3,8 (one load, set_bits in between) = a 3-bit `matgptq slice` checkpoint and a fresh load at 8.
    On stories260K, a trained model whose 3- and 8-bit slices answer some questions differently (the random tiny
    model's did not once the master weight λ_8 became 16: its answers are near ties decided the same way)."""
    parent = stories_parent
    both = cli_scores([parent, "--tasks", TASKS, "--tasks-dir", tasks_dir, "--bits", "3,8"], tmp_path)
    assert main(["slice", str(parent), "--bits", "3", "--out", str(tmp_path / "s3")]) == 0
    alone3 = cli_scores([tmp_path / "s3", "--tasks", TASKS, "--tasks-dir", tasks_dir], tmp_path, "s3.json")
    specs = resolve_tasks(TASKS, tasks_dir)
    model8 = matgptq.load(parent, bits=8)
    alone8 = score_tasks(wrap_model(model8, load_tokenizer(parent)), specs)
    names = [s.name for s in specs] + ["average"]
    for name in names:
        assert {m: both[("3", name)][m] for m in ("n", "acc", "acc_norm")} == {
            m: alone3[("3", name)][m] for m in ("n", "acc", "acc_norm")
        }, name
    for s in specs:
        assert {m: both[("8", s.name)][m] for m in ("n", "acc", "acc_norm")} == alone8[s.name], s.name
    # the comparison has teeth only if the widths score differently somewhere
    assert any(both[("3", n)][m] != both[("8", n)][m] for n in names for m in ("acc", "acc_norm"))


def test_text_and_tasks_together(lm_eval, parent, tasks_dir, tmp_path, capsys):
    text = SHARED / "data" / "tinystories" / "tinystories_val_head.txt"
    js = tmp_path / "both.json"
    args = [
        "eval",
        str(parent),
        "--bits",
        "4",
        "--text",
        str(text),
        "--seqlen",
        "64",
        "--max-tokens",
        "256",
        "--tasks",
        "wino",
        "--tasks-dir",
        str(tasks_dir),
        "--limit",
        "3",
        "--json",
        str(js),
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "| ppl" in out.replace("  ", " ") and "wino" in out and "average" in out
    report = json.loads(js.read_text())
    assert report["results"][0]["tokens"] == 256 and math.isfinite(report["results"][0]["ppl"])
    assert report["task_results"][0]["n"] == 3 and report["limit"] == 3


def run_error(args, capsys) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("matgptq: error: ") and err.count("\n") == 1 and "Traceback" not in err
    return err


@pytest.mark.parametrize(
    "line,message",
    [
        ('{"query": "Q", "choices": ["a", "b"], "gold": 2}', "bad.jsonl:2: gold 2 is not an index of its 2 options"),
        ('{"query": "Q", "choices": ["a", "b"], "gold": -1}', "gold -1 is not an index"),
        ('{"query": "Q", "choices": ["a", "b"], "gold": 1', "bad.jsonl:2 is not valid JSON"),
        ('{"question": "Q", "answers": ["a", "b"], "gold": 0}', "bad.jsonl:2 has keys ['answers', 'gold', 'question']"),
        ('{"query": "Q", "choices": ["a"], "gold": 0}', "bad.jsonl:2: expected a string and a list of at least two"),
        ('{"context_options": ["a", "b"], "continuation": "c", "gold": 0}', "mixes the query/choices and context_opt"),
        ("", "bad.jsonl:2 is empty"),
    ],
)
def test_bad_task_files(tmp_path, capsys, line, message, tiny_bpe_llama_dir):
    (tmp_path / "bad.jsonl").write_text('{"query": "Q", "choices": ["a", "b"], "gold": 0}\n' + line + "\n")
    js = tmp_path / "out.json"
    err = run_error(
        ["eval", str(tiny_bpe_llama_dir), "--tasks", "bad", "--tasks-dir", str(tmp_path), "--json", str(js)], capsys
    )
    assert message in err and not js.exists()


def test_bad_task_options(tmp_path, capsys, tiny_bpe_llama_dir, tasks_dir):
    model = str(tiny_bpe_llama_dir)
    err = run_error(["eval", model, "--tasks", "arc_easy,hellaswag", "--tasks-dir", str(tasks_dir)], capsys)
    assert "unknown task 'hellaswag'" in err and "(tasks in " in err and "arc_easy, piqa, wino)" in err
    err = run_error(["eval", model, "--tasks", "arc_easy", "--tasks-dir", str(tmp_path / "nope")], capsys)
    assert "tasks directory" in err and "--tasks-dir" in err
    assert "give --text FILE (perplexity) and/or --tasks" in run_error(["eval", model], capsys)
    assert "--limit must be at least 1" in run_error(
        ["eval", model, "--tasks", "wino", "--tasks-dir", str(tasks_dir), "--limit", "0"], capsys
    )
    assert "give --text FILE too" in run_error(["eval", model, "--tasks", "wino", "--kl-to", model], capsys)


def test_missing_lm_eval_is_one_line(monkeypatch, tmp_path, capsys, tiny_bpe_llama_dir, tasks_dir):
    monkeypatch.setitem(__import__("sys").modules, "lm_eval", None)  # `import lm_eval` raises ImportError
    js = tmp_path / "out.json"
    err = run_error(
        ["eval", str(tiny_bpe_llama_dir), "--tasks", "wino", "--tasks-dir", str(tasks_dir), "--json", str(js)], capsys
    )
    assert "pip install 'matgptq[tasks]'" in err and not js.exists()


def test_answers_longer_than_the_context_are_refused_where_lm_eval_fails(lm_eval, tmp_path, capsys):
    """stories260K holds 512 tokens. Oracle: lm-eval itself, which stops on an assertion for a continuation longer
    than the context and scores one that fits. Answers of ~max_length - 2 .. max_length + 2 tokens (" a" repeated;
    both task shapes): the check refuses exactly those lm-eval fails on, and both outcomes occur. Then, end to end,
    `eval --tasks` on a file whose third question is too long: one line naming file:line, nothing written."""
    model, tokenizer = matgptq.load(STORIES), load_tokenizer(STORIES)
    lm = wrap_model(model, tokenizer, batch_size=1)
    outcomes = set()
    for shape in SHAPES:
        for k in range(lm.max_length - 2, lm.max_length + 3):
            answer = " ".join(["a"] * k)
            doc = (
                {"query": "Question: Which?\n", "choices": [answer, "b"], "gold": 0}
                if shape == "choices"
                else {"context_options": ["The cat", "The dog"], "continuation": answer, "gold": 0}
            )
            path = tmp_path / f"{shape}{k}.jsonl"
            path.write_text(json.dumps(doc) + "\n" + json.dumps(doc) + "\n")
            spec = TaskSpec(path.stem, path, shape, 2)
            try:
                run_lm_eval(lm, [spec])
                lm_eval_fails = False
            except AssertionError:
                lm_eval_fails = True
            with pytest.raises(UserError) if lm_eval_fails else contextlib.nullcontext():
                check_answers_fit([spec], lm.tok_encode, lm.max_length)
            outcomes.add(lm_eval_fails)
    assert outcomes == {True, False}
    fits = json.dumps({"query": "Q", "choices": ["a", "b"], "gold": 0})
    long = json.dumps({"query": "Q", "choices": [" ".join(["a"] * 2 * lm.max_length), "b"], "gold": 0})
    (tmp_path / "long.jsonl").write_text("\n".join([fits, fits, long, fits]) + "\n")
    js = tmp_path / "out.json"
    capsys.readouterr()
    err = run_error(["eval", str(STORIES), "--tasks", "long", "--tasks-dir", str(tmp_path), "--json", str(js)], capsys)
    assert "long.jsonl:3: an answer of " in err and "512-token context" in err and "--limit 2" in err
    assert not js.exists()
    assert main(["eval", str(STORIES), "--tasks", "long", "--tasks-dir", str(tmp_path), "--limit", "2"]) == 0


def test_tasks_dir_comes_from_the_option_or_the_environment(monkeypatch, tmp_path):
    """$MATGPTQ_TASKS_DIR when --tasks-dir is not given; neither: a one-line error, no path guessed."""
    monkeypatch.delenv("MATGPTQ_TASKS_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="no tasks directory: pass --tasks-dir DIR or set MATGPTQ_TASKS_DIR"):
        resolve_tasks("arc_easy,piqa")
    shutil.copytree(ZERO_SHOT, tmp_path / "zero-shot")
    monkeypatch.setenv("MATGPTQ_TASKS_DIR", str(tmp_path / "zero-shot"))
    assert [s.size for s in resolve_tasks("arc_easy,piqa")] == [2376, 1838]
    assert resolve_tasks(["piqa"]) == [TaskSpec("piqa", (tmp_path / "zero-shot/piqa.jsonl").resolve(), "choices", 1838)]


@pytest.mark.slow
def test_real_model_equals_lm_evals_own_hf_path(lm_eval, tmp_path):
    """SmolLM2-135M-Instruct (`make real-model`; skipped when it was never made), 20 questions of each shared task."""
    real = REAL_MODEL
    if not (real / "model.safetensors").is_file():
        pytest.skip(f"{real} not made (make real-model)")
    specs = resolve_tasks("arc_easy,piqa", ZERO_SHOT)
    ours = cli_scores(
        [real, "--tasks", "arc_easy,piqa", "--tasks-dir", ZERO_SHOT, "--limit", 20, "--task-batch-size", 8], tmp_path
    )
    theirs = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={real},dtype=float32,device=cpu",
        batch_size=8,
        tasks=[task_config(s) for s in specs],
        limit=20,
        bootstrap_iters=0,
        task_manager=lm_eval.tasks.TaskManager(include_defaults=False),
    )
    for s in specs:
        for metric in ("acc", "acc_norm"):
            assert ours[("fp", s.name)][metric] == theirs["results"][s.name][f"{metric},none"], (s.name, metric)
        assert ours[("fp", s.name)]["n"] == 20
