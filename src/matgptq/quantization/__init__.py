"""Model → parent: the integer grid (grid), GPTQ/RTN on one matrix (solver), MatGPTQ's multi-width code choice
(multibit), the validated settings (config) and the block-by-block pass over a model (pipeline)."""

from .config import CalibConfig, Method, QuantConfig
from .pipeline import LayerReport, quantize_model

__all__ = ["CalibConfig", "Method", "QuantConfig", "LayerReport", "quantize_model"]
