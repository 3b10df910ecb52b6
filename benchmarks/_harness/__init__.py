"""What every benchmark shares: where the pages live, the generated-page header, the page writer, the one writer of a
marked block inside a hand-written page, a markdown table, the figure set-up and tail (matplotlib without a display),
and a measured child process (wall, CPU and its own peak RSS) with the machine it ran on.

The harness is the one package every benchmark may import (benchmarks/<topic>/<name>.py imports no other benchmark:
tests/test_benchmarks_layout.py); besides this module it holds what several benchmarks drive: llama.cpp's tools
(llamacpp.py), the SmolLM2 protocol and its scoring (smollm2.py) and the peers' quantization worker (peers.py).
Pages are rendered by the benchmarks' own pure functions from their JSON; benchmarks/render_docs.py lists them all and
re-renders or checks them (`python -m benchmarks.render_docs --check`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"  # every generated page, its figure and the JSON it is rendered from


def child_env(threads: int | None = None, **extra: str) -> dict[str, str]:
    """The environment of a measured child: this tree's package and benchmarks first on the path (a child started as
    `-m benchmarks.TOPIC.NAME` or `-m matgptq` from any directory, with any interpreter, runs this tree's code), `threads`
    threads for torch and GPTQModel, no torch.compile, quiet tokenizers; `extra` on top."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "TORCHDYNAMO_DISABLE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    if threads is not None:  # GPTQModel's model loader asks its CPU pool for 2 workers and refuses a smaller pool
        env.update(OMP_NUM_THREADS=str(threads), GPTQMODEL_CPU_WORKERS=str(max(2, threads)))
    return {**env, **extra}


# Linux carries a process's peak RSS across fork and exec (exec records the old image's high-water mark), so a child
# forked from a big parent reports at least the parent's peak. Children are therefore started by this small launcher,
# whose own peak at fork time is a bare interpreter's: wait4's ru_maxrss is then the command's own.
_LAUNCHER = """import json, os, subprocess, sys, time
t0 = time.perf_counter()
with open(sys.argv[2], "w") as log:
    proc = subprocess.Popen(sys.argv[3:], stdout=log, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(proc.pid, 0)
open(sys.argv[1], "w").write(json.dumps({"wall": time.perf_counter() - t0, "cpu": usage.ru_utime + usage.ru_stime,
    "rss_gb": usage.ru_maxrss / 2**20, "ok": os.waitstatus_to_exitcode(status) == 0}))
"""


def run_measured(cmd: list[str], env: dict, log: Path) -> dict:
    """Run `cmd` (output to `log`) and return its wall and CPU seconds (user+sys), peak RSS in GiB and success."""
    result = Path(log).with_suffix(".usage.json")
    subprocess.run([sys.executable, "-c", _LAUNCHER, str(result), str(log), *map(str, cmd)], env=env, check=True)
    return json.loads(result.read_text())


def last_error(log: Path) -> str:
    """The last line of `log` naming an error (else its last line): why a child failed, in one line."""
    lines = [ln for ln in Path(log).read_text(errors="replace").splitlines() if ln.strip()]
    return next((ln for ln in reversed(lines) if "Error" in ln or "error" in ln), lines[-1] if lines else "?")


def pytest_junit(args: list[str], name: str, env: dict | None = None) -> tuple[Path | None, int]:
    """Run pytest on `args` from the repository root with a junit XML report (legacy family, as the tables read it)
    in a temporary `name`.xml: (its path, pytest's exit status); the path is None where pytest wrote no report."""
    junit = Path(tempfile.mkdtemp()) / f"{name}.xml"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *args,
        "-q",
        "-p",
        "no:cacheprovider",
        f"--junitxml={junit}",
        "-o",
        "junit_family=legacy",
    ]
    rc = subprocess.run(cmd, cwd=ROOT, env=env).returncode
    return (junit if junit.is_file() else None), rc


def write_results(md: Path, data: dict, text: str) -> None:
    """`data` as the JSON beside the page `md` (same name, .json), then the page `text` rendered from it."""
    write_atomic(Path(md).with_suffix(".json"), json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    write_page(md, text)


def measured_child(cmd: list[str], threads: int, log: Path) -> dict:
    """`cmd` as one measured run of a results script (child_env with `threads` threads): run_measured's numbers,
    the load average when it ended, the commit it ran at (machine()) and, where it failed, its last line naming an
    error; kept in the usage file beside `log`, which a record reusing the run reads (search.ten_minutes
    --reuse-slow)."""
    row = {
        **run_measured(cmd, child_env(threads), log),
        "load_average": os.getloadavg()[0],
        "commit": machine()["commit"],
    }
    if not row["ok"]:
        row["error"] = last_error(log)
    write_atomic(Path(log).with_suffix(".usage.json"), json.dumps(row))  # read back by reused_slow
    return row


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo) and its widest vector unit (and AMX, its bfloat16 matrix unit), or the
    platform's processor string. The unit is named because one model name covers several hosts: "AMD EPYC" has been
    an AVX2 and an AVX-512 machine here, and "Intel Xeon Processor" an AVX-512 one with and without AMX, whose GEMMs
    (float32, and bfloat16 above all) differ, so their CPU seconds do not compare."""
    import platform

    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    name = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), None)
    if name is None:
        return platform.processor() or platform.machine()
    flags = set(next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), []))
    unit = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else None
    if unit and "amx_bf16" in flags:
        unit += ", AMX"
    return f"{name} ({unit})" if unit else name


def git_commit() -> str | None:
    """The short commit of this tree, or None outside a git checkout."""
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True
    )
    return done.stdout.strip() or None if done.returncode == 0 else None


def machine() -> dict:
    """What a timing depends on beyond the code: the CPU model (a BLAS may take slower paths on another vendor's
    CPUs), the cores, and the commit measured (+changes: with uncommitted changes to tracked files outside
    docs/results, where a record writes its own JSON and page after every seed)."""
    commit = git_commit()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs/results"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return {"cpu": cpu_name(), "cores": os.cpu_count(), "commit": commit and commit + ("+changes" if dirty else "")}


def machine_lines(seeds: list[str], runs: list[dict]) -> list[str]:
    """A page's lines naming the host and commit each seed's run was measured at (its `machine()` record; runs
    recorded before there was one have none)."""
    return [
        f"- seed {s}: measured on {m['cpu']}, {m['cores']} cores, at commit {m['commit']}"
        for s, r in zip(seeds, runs)
        if (m := r.get("machine"))
    ]


def header(script: str, *sources: str) -> str:
    """The first line of a generated page: which script renders it, from which JSON(s) under docs/results/."""
    return (
        f"<!-- generated by {script} from {', '.join(sources)}; `python -m benchmarks.render_docs` "
        f"re-renders it; do not edit -->"
    )


def format_table(headers: list[str], rows: list[list]) -> str:
    """A GitHub-markdown table (also readable in a terminal), its columns padded to their widest cell; a float shows
    4 significant digits, trailing zeros dropped. The pages' own copy of matgptq.execution.format_table, so that a
    change in the package's tables leaves the rendered pages as they are."""
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(cells[0]), sep] + [line(r) for r in cells[1:]])


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e-3 or abs(v) >= 1e4 else f"{v:.4f}".rstrip("0").rstrip(".")
    return "" if v is None else str(v)


def load_json(path: Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def write_page(path: Path, text: str) -> None:
    """Write a page (a single trailing newline)."""
    write_atomic(Path(path), text.rstrip("\n") + "\n")


def write_atomic(path: Path, text: str) -> None:
    """`text` (UTF-8) at `path`, whole or not at all: written beside it, then renamed over it, so that a run killed
    while writing leaves the file before it, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def read_block(path: Path, name: str) -> str | None:
    """The text between `<!-- NAME:start -->` and `<!-- NAME:end -->` in `path` (None without both markers)."""
    body = Path(path).read_text(encoding="utf-8") if Path(path).is_file() else ""
    start, end = _markers(name)
    if start not in body or end not in body:
        return None
    return body[body.index(start) + len(start) : body.index(end)].strip("\n")


def write_block(path: Path, name: str, text: str) -> bool:
    """Replace what stands between `path`'s `<!-- NAME:start -->` and `<!-- NAME:end -->` with `text` (a page written
    by hand with one generated block); False, and nothing written, where the markers are missing."""
    body = Path(path).read_text(encoding="utf-8") if Path(path).is_file() else ""
    start, end = _markers(name)
    if start not in body or end not in body:
        return False
    body = body[: body.index(start)] + f"{start}\n{text.strip(chr(10))}\n{end}" + body[body.index(end) + len(end) :]
    Path(path).write_text(body, encoding="utf-8")
    return True


def pyplot():
    """matplotlib.pyplot on the file-only backend (no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path, dpi: int = 110) -> None:
    """The tail of every plot: tight layout, write, close."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, metadata={"Software": None})  # no matplotlib version in the file
    plt.close(fig)
