"""Entry: the build python's torch facts (or why there are none)."""

from __future__ import annotations

from porter.probes.protocol import emit  # porter: concatenated
from porter.probes.torch_facts import torch_info  # porter: concatenated

emit(torch_info())
