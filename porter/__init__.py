"""porter: take a Megatron-DeepSpeed training stack to AMD ROCm GPUs."""

__version__ = "0.1.0"
