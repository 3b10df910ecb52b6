"""Exports of quantized checkpoints to formats other tools run: GPTQ (v1/v2), compressed-tensors (`pack-quantized`)
and GGUF; `matgptq export` (cli)."""

from .cli import add_export_parser, cmd_export

__all__ = ["add_export_parser", "cmd_export"]
