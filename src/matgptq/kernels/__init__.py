"""GPU layouts and kernels: the nested bit-plane layout (bitplanes) and its Triton GEMV/GEMM (triton_nested)."""

from .bitplanes import NestedLayout

__all__ = ["NestedLayout"]
