"""Model → parent. The algorithm on one matrix is algorithm/ (start with algorithm/reference.py, GPTQ on one
screen); around it, the pipeline: the typed settings per method (config; built by method name in method_configs) and
of a run (options) and of the calibration windows (calibration), one layer solved (layer), the block-by-block pass
over a model (pipeline: its loop; passes, block_groups, block_io: its forward passes, groups, inputs and outputs),
the resume state (resume) and what a whole run does (run)."""

from .calibration import CalibConfig
from .config import GPTQConfig, GridConfig, MatGPTQConfig, Method, MethodConfig, RTNConfig, Target, Variant, method_of
from .layer import LayerReport
from .method_configs import config_for, config_from_json
from .options import RunConfig
from .pipeline import quantize_model

__all__ = [
    "CalibConfig",
    "GridConfig",
    "RTNConfig",
    "GPTQConfig",
    "MatGPTQConfig",
    "MethodConfig",
    "Method",
    "Target",
    "Variant",
    "config_for",
    "config_from_json",
    "method_of",
    "LayerReport",
    "quantize_model",
    "RunConfig",
]
