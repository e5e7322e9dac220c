"""How a Megatron-DeepSpeed training is started for a launch plan (:mod:`porter.cluster.site.launch`): the
arguments of its ``pretrain_*.py`` and the DeepSpeed config beside them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

CONFIG = "ds_config.json"
"""The DeepSpeed config's file name beside the job script."""


def training_config(p: Any) -> dict[str, Any]:
    """The DeepSpeed config of the plan ``p`` (a launch ``Plan``): batch sizes, ZeRO stage, bf16."""
    return {"train_batch_size": p.global_batch, "train_micro_batch_size_per_gpu": p.micro_batch,
            "gradient_accumulation_steps": p.microbatches, "zero_optimization": {"stage": p.zero_stage},
            "bf16": {"enabled": True}, "gradient_clipping": 1.0, "steps_per_print": 10,
            "wall_clock_breakdown": False}


def training_args(p: Any, config: Path) -> list[str]:
    """Megatron-DeepSpeed's arguments for the plan ``p``'s layout and model, reading ``config``."""
    m = p.model
    args = ["--tensor-model-parallel-size", str(p.tp), "--pipeline-model-parallel-size", str(p.pp),
            "--num-layers", str(m.layers), "--hidden-size", str(m.hidden), "--num-attention-heads", str(m.heads),
            "--seq-length", str(m.seq), "--max-position-embeddings", str(m.seq),
            "--micro-batch-size", str(p.micro_batch), "--global-batch-size", str(p.global_batch), "--bf16",
            "--deepspeed", "--deepspeed_config", str(config), "--zero-stage", str(p.zero_stage)]
    return args + (["--checkpoint-activations"] if p.recompute else [])
