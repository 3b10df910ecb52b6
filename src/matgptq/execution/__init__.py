"""Where and how work runs, for every stage: the device (devices), torch.distributed processes under torchrun
(distributed), freed memory handed back between steps (memory) and the plain-text tables commands and scripts print
(tables)."""

from .devices import CHOICES_HELP, DTYPES, compute_dtype, model_device, native_bfloat16, native_half, resolve_device
from .distributed import combine_hessians, dist_backend, init_from_env, shard, share, world
from .memory import release_free_memory
from .tables import format_table

__all__ = [
    "CHOICES_HELP",
    "DTYPES",
    "compute_dtype",
    "model_device",
    "native_bfloat16",
    "native_half",
    "resolve_device",
    "combine_hessians",
    "dist_backend",
    "init_from_env",
    "share",
    "shard",
    "world",
    "format_table",
    "release_free_memory",
]
