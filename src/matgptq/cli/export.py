"""`matgptq export`: parse, call the format's writer, print what was written and which readers run it."""

from __future__ import annotations

import argparse
import sys
import warnings

from ..api import export
from ..exporters.gguf import GGUFExportWarning, export_gguf
from ..exporters.readers import ct_readers, gguf_readers, gptq_readers
from ..formats.checksums import trusted
from ..formats.gguf import EMBED_TYPES
from .argtypes import DefaultsHelpFormatter, add_verify_option


def add_parser(sub) -> None:
    x = sub.add_parser(
        "export",
        formatter_class=DefaultsHelpFormatter,
        help="export a parent or quantized checkpoint as GPTQ (v1/v2), compressed-tensors or GGUF",
    )
    x.add_argument("src", help="matgptq parent/slice or quantized checkpoint directory")
    x.add_argument(
        "--format", required=True, choices=["gptq_v1", "gptq_v2", "compressed-tensors", "gguf"], help="target format"
    )
    x.add_argument("--bits", type=int, help="slice width to export (default: the stored width)")
    x.add_argument("--bits-config", help="JSON {layer: bits} per-layer mix (e.g. from a search)")
    x.add_argument(
        "--type",
        default="auto",
        help="gguf: block type (auto|q4_0|q4_1|q5_0|q5_1|q8_0|q2_k|q3_k|q4_k|q5_k|q6_k); "
        "K-quants are exact for parents quantized with --kquant",
    )
    x.add_argument("--float-type", choices=["f32", "f16"], default="f32", help="gguf: type of unquantized tensors")
    x.add_argument(
        "--embed-type",
        choices=list(EMBED_TYPES),
        default="auto",
        help="gguf: token embedding / output type (llama-quantize's --token-embedding-type); auto "
        "= llama.cpp's presets: Q6_K, or Q8_0 when a row is not a multiple of 256; f32 "
        "keeps them exact; the block types re-quantize them as llama-quantize does",
    )
    x.add_argument("--out", required=True, help="output directory (GPTQ, compressed-tensors) or .gguf file")
    x.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    add_verify_option(x)
    x.add_argument(
        "--verbose",
        action="store_true",
        help="gguf: also print every tensor's type, method, exactness and max |Δw| (one row per tensor; by "
        "default only their summary)",
    )


def run(a: argparse.Namespace) -> None:
    with trusted(a.no_verify):
        _run(a)


def _run(a: argparse.Namespace) -> None:
    if a.format == "gguf":
        _gguf(a)
        return
    out = export(a.src, a.out, a.format, bits=a.bits, bits_config=a.bits_config, overwrite=a.overwrite)
    if a.format == "compressed-tensors":
        print(f"wrote {out} (compressed-tensors pack-quantized)")
        print(ct_readers(out).line())
    else:
        print(f"wrote {out} ({a.format})")
        print(gptq_readers(out).line())


def _gguf(a: argparse.Namespace) -> None:
    """Export and print the report's summary (with --verbose, every tensor), its warnings, and the readers line."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GGUFExportWarning)  # the report lists them
        rep = export_gguf(
            a.src,
            a.out,
            bits=a.bits,
            bits_config=a.bits_config,
            qtype=a.type,
            overwrite=a.overwrite,
            float_type=a.float_type,
            embed_type=a.embed_type,
        )
    if a.verbose:
        print(rep.table())
    for w in rep.warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(rep.summary())
    print(
        f"wrote {rep.path} ({rep.size_bytes / 2**20:.2f} MiB, {rep.bits_per_weight:.2f} bits per weight, mostly "
        f"{rep.file_type.upper()})"
    )
    print(gguf_readers(rep.path).line())
