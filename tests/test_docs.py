"""Every relative link in README.md and docs/**/*.md points at a file that exists (a moved page leaves no dangling
link). That every generated page equals its rendering from its JSON is `make docs-check`'s (benchmarks/render_docs.py),
which CI runs beside the tests: no test imports or runs a benchmark.
"""

from __future__ import annotations

import re
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
    text = (
        'see [a](docs/a.md#x), ![fig](b.png "t"), [web](https://x.org), [top](#top)\n'
        "[ref]: c.json\n`[not](code.md)`\n```\n[nor](block.md)\n```\n"
    )
    assert relative_links(text) == ["docs/a.md#x", "b.png", "c.json"]
