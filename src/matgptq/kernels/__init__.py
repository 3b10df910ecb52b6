"""GPU layouts and kernels: the nested bit-plane layout (bitplanes) and its Triton GEMV/GEMM (triton_nested); the
GPTQ solver's fused column step (gptq_column)."""

from .bitplanes import NestedLayout

__all__ = ["NestedLayout"]
