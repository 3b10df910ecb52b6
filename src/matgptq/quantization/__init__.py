"""Model → parent: the integer grid (grid), GPTQ/RTN on one matrix (solver), MatGPTQ's multi-width code choice
(multibit), per-width scales (refit), the validated settings (config) and the block-by-block pass over a model
(pipeline)."""

from .config import CalibConfig, Method, QuantConfig, Variant
from .pipeline import LayerReport, quantize_model

__all__ = ["CalibConfig", "Method", "QuantConfig", "Variant", "LayerReport", "quantize_model"]
