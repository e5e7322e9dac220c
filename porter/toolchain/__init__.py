"""Toolchain profiles: the model (``profile``), the arch table (``archs``), program discovery
(``discover``) and ``porter toolchain check`` (``check``). Presets are data in ``presets/``."""
