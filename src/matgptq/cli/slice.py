"""`matgptq slice`: parse, call `matgptq.slice`, print what was written."""

from __future__ import annotations

import argparse

from ..api import slice as slice_parent
from .argtypes import DefaultsHelpFormatter, add_verify_option


def add_parser(sub) -> None:
    s = sub.add_parser(
        "slice",
        help="write a standalone r-bit checkpoint (only the r-bit data) from a parent",
        formatter_class=DefaultsHelpFormatter,
    )
    s.add_argument("parent", help="matgptq parent checkpoint directory")
    s.add_argument("--bits", type=int, required=True, help="slice width r (2..master)")
    s.add_argument("--out", required=True, help="output checkpoint directory")
    s.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    add_verify_option(s)


def run(a: argparse.Namespace) -> None:
    out = slice_parent(a.parent, a.bits, a.out, a.overwrite, verify=not a.no_verify)
    size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    print(f"wrote {a.out}: {a.bits}-bit slice, {size / 1e6:.2f} MB of tensors")
