"""Toolchain profiles: the model (``profile``), the arch table (``archs``), program discovery
(``discover``) and ``porter toolchain check`` (``check``). Presets are data in ``presets/``."""

from porter.toolchain.profile import Toolchain, load_toolchain, preset_names, toolchain_env

__all__ = ["Toolchain", "load_toolchain", "preset_names", "toolchain_env"]
