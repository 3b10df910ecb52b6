"""Model → parent: the integer grid (grid), GPTQ/RTN on one matrix (solver), MatGPTQ's multi-width code choice
(multibit), per-width scales (refit), the validated settings (config), the block-by-block pass over a model
(pipeline) and what a whole run does around it (run)."""

from .config import CalibConfig, Method, QuantConfig, Variant
from .pipeline import LayerReport, quantize_model

__all__ = ["CalibConfig", "Method", "QuantConfig", "Variant", "LayerReport", "quantize_model"]
