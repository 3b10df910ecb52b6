"""`matgptq export`: the command-line entry for every export format."""

from __future__ import annotations

import argparse

from ..argtypes import DefaultsHelpFormatter
from ..formats.gguf import EMBED_TYPES


def add_export_parser(sub) -> None:
    x = sub.add_parser("export", formatter_class=DefaultsHelpFormatter,
                       help="export a parent or quantized checkpoint as GPTQ (v1/v2), compressed-tensors or GGUF")
    x.add_argument("src", help="matgptq parent/slice or quantized checkpoint directory")
    x.add_argument("--format", required=True, choices=["gptq_v1", "gptq_v2", "compressed-tensors", "gguf"],
                   help="target format")
    x.add_argument("--bits", type=int, help="slice width to export (default: the stored width)")
    x.add_argument("--bits-config", help="JSON {layer: bits} per-layer mix (e.g. from a search)")
    x.add_argument("--type", default="auto", help="gguf: block type (auto|q4_0|q4_1|q5_0|q5_1|q8_0|q2_k|q3_k|q4_k|q5_k|q6_k); "
                                                  "K-quants are exact for parents quantized with --kquant")
    x.add_argument("--float-type", choices=["f32", "f16"], default="f32", help="gguf: type of unquantized tensors")
    x.add_argument("--embed-type", choices=list(EMBED_TYPES), default="auto",
                   help="gguf: token embedding / output type (llama-quantize's --token-embedding-type); auto "
                        "= llama.cpp's presets: Q6_K, or Q8_0 when a row is not a multiple of 256; f32 "
                        "keeps them exact; the block types re-quantize them as llama-quantize does")  # fmt: skip
    x.add_argument("--out", required=True, help="output directory (GPTQ, compressed-tensors) or .gguf file")
    x.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    x.add_argument("--verbose", action="store_true",
                   help="gguf: also print every tensor's type, method, exactness and max |Δw| (one row per tensor; by "
                        "default only their summary)")  # fmt: skip


def cmd_export(a: argparse.Namespace) -> None:
    if a.format == "gguf":
        from .gguf import export_gguf_cli

        export_gguf_cli(a)
    elif a.format == "compressed-tensors":
        from .compressed_tensors import export_compressed_tensors_cli

        export_compressed_tensors_cli(a)
    else:
        from .gptq import export_gptq_cli

        export_gptq_cli(a)
