"""tests/skipped.py, CI's peer pass: a whole run records what it skipped, `--rerun-skipped` runs exactly that.

Checked on a throwaway suite in a child pytest: a module skipped at import, a test skipped in its body, a passing one.
"""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CONFTEST = "from tests.skipped import pytest_addoption, pytest_collection_modifyitems, pytest_configure  # noqa\n"
PEER_MODULE = """
import os, pytest
if os.environ.get("PEER") != "1":
    pytest.skip("peer missing", allow_module_level=True)
def test_peer_a(): pass
def test_peer_b(): pass
"""
MIXED_MODULE = """
import os, pytest
def test_plain(): pass
@pytest.mark.parametrize("n", [1, 2])
def test_body_skip(n):
    if os.environ.get("PEER") != "1" and n == 2:
        pytest.skip("peer missing")
"""


def _suite(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text('[tool.pytest.ini_options]\ntestpaths = ["t"]\n')
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "conftest.py").write_text(CONFTEST)
    (tmp_path / "t" / "test_peer.py").write_text(PEER_MODULE)
    (tmp_path / "t" / "test_mixed.py").write_text(MIXED_MODULE)
    return tmp_path


def _pytest(root: Path, *args: str, peer: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PEER": "1" if peer else "0"}
    env.pop("PYTEST_ADDOPTS", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-rA", *args]
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=120)


def _passed(out: str) -> set[str]:
    return {line.split()[1] for line in out.splitlines() if line.startswith("PASSED ")}


def test_rerun_runs_only_what_the_whole_run_skipped(tmp_path):
    root = _suite(tmp_path)
    first = _pytest(root)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "2 passed" in first.stdout and "2 skipped" in first.stdout  # the skipped module counts once
    second = _pytest(root, "--rerun-skipped", peer=True)
    assert second.returncode == 0, second.stdout + second.stderr
    assert _passed(second.stdout) == {
        "t/test_peer.py::test_peer_a",
        "t/test_peer.py::test_peer_b",
        "t/test_mixed.py::test_body_skip[2]",
    }


def test_a_partial_run_does_not_replace_the_record(tmp_path):
    root = _suite(tmp_path)
    _pytest(root)
    _pytest(root, "t/test_mixed.py")  # paths given: not a whole run, records nothing
    _pytest(root, "-k", "plain")  # tests left out: records nothing either
    again = _pytest(root, "--rerun-skipped", peer=True)
    assert "t/test_peer.py::test_peer_a" in _passed(again.stdout)


def test_rerun_without_a_record_is_a_usage_error(tmp_path):
    result = _pytest(_suite(tmp_path), "--rerun-skipped")
    assert result.returncode == 4  # pytest's usage-error exit status
    assert "run the whole suite first" in result.stderr
