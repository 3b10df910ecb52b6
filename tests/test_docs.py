"""The docs cannot drift: every generated page equals its rendering from its JSON (`python -m benchmarks.render_docs --check`), and
every relative link in README.md and docs/**/*.md points at a file that exists (a moved page leaves no dangling link).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[1]
# [text](target "title") and ![alt](target); [label]: target (reference definitions)
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE = re.compile(r"(`+).+?\1", re.S)


def markdown_files() -> list[Path]:
    return [f for f in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))] if f.is_file()]


def relative_links(text: str) -> list[str]:
    """Link targets that name a file in the repository (no scheme, no pure #anchor), code spans and blocks left out."""
    text = CODE.sub("", FENCE.sub("", text))
    targets = INLINE.findall(text) + REFERENCE.findall(text)
    return [t for t in targets if not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", t) and not t.startswith("#")]


def test_generated_pages_match_their_json():
    env = {k: v for k, v in os.environ.items() if not k.endswith("_PROXY") and not k.endswith("_proxy")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", MPLBACKEND="Agg")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.render_docs", "--check"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, f"docs drifted from their JSON:\n{proc.stderr}{proc.stdout}"


def test_relative_links_resolve():
    dangling = []
    for md in markdown_files():
        for target in relative_links(md.read_text(encoding="utf-8")):
            path = unquote(target.split("#", 1)[0].split("?", 1)[0])
            if not path:
                continue
            resolved = ROOT / path.lstrip("/") if path.startswith("/") else md.parent / path
            if not resolved.exists():
                dangling.append(f"{md.relative_to(ROOT)}: {target}")
    assert not dangling, "links to files that do not exist:\n" + "\n".join(dangling)


def test_link_finder_sees_links_and_skips_code():
    text = ("see [a](docs/a.md#x), ![fig](b.png \"t\"), [web](https://x.org), [top](#top)\n"
            "[ref]: c.json\n`[not](code.md)`\n```\n[nor](block.md)\n```\n")  # fmt: skip
    assert relative_links(text) == ["docs/a.md#x", "b.png", "c.json"]
