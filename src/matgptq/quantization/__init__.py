"""Model → parent: the integer grid (grid), GPTQ/RTN on one matrix (solver), MatGPTQ's multi-width code choice
(multibit), per-width scales (refit), the typed settings per method (config) and of the calibration windows
(calibration), one layer solved from them (layer), the block-by-block pass over a model (pipeline) and what a whole
run does around it (run)."""

from .calibration import CalibConfig
from .config import (
    GPTQConfig, GridConfig, MatGPTQConfig, Method, MethodConfig, RTNConfig, Target, Variant, config_for,
    config_from_json, method_of,
)  # fmt: skip
from .layer import LayerReport
from .pipeline import quantize_model

__all__ = ["CalibConfig", "GridConfig", "RTNConfig", "GPTQConfig", "MatGPTQConfig", "MethodConfig", "Method", "Target",
           "Variant", "config_for", "config_from_json", "method_of", "LayerReport", "quantize_model"]
