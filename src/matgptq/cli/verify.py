"""`matgptq verify`: check a matgptq checkpoint whole (every tensor against its checksum, every structural rule of the
format), or record the checksums of one written before them (the upgrade to format v4, docs/formats.md §1.5)."""

from __future__ import annotations

import argparse

from ..formats.parent import add_checksums, read_checkpoint, read_layout
from .argtypes import DefaultsHelpFormatter


def add_parser(sub) -> None:
    v = sub.add_parser(
        "verify",
        formatter_class=DefaultsHelpFormatter,
        help="check a matgptq parent or slice against its checksums, or add them to an older one",
    )
    v.add_argument("checkpoint", help="matgptq parent or slice directory")
    v.add_argument(
        "--add-checksums",
        action="store_true",
        help="record the checksums of a checkpoint written before matgptq recorded them (format v1-v3), "
        "after checking its structure: its matgptq.json is replaced, its tensors are not touched",
    )


def run(a: argparse.Namespace) -> None:
    if a.add_checksums:
        n = add_checksums(a.checkpoint)
        print(f"{a.checkpoint}: recorded the checksums of its {n} tensors (now format v4)")
        return
    layout = read_layout(a.checkpoint)
    ckpt = read_checkpoint(a.checkpoint, verify=True)
    if layout.sums is None:
        print(
            f"{a.checkpoint}: sound, but format v{layout.meta['format_version']} records no checksums, so damage "
            "to a tensor's values cannot be seen; `matgptq verify --add-checksums` records them"
        )
        return
    print(
        f"{a.checkpoint}: every one of its {len(layout.sums)} tensors matches its checksum "
        f"({len(ckpt.layers)} quantized layers)"
    )
