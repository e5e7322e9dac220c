"""Reading what users write (profiles, site profiles, patch sets, hipify maps, matrix files): one TOML reader
and one check of a table's keys, so every file says a syntax error and a misspelt key the same way."""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Collection, Mapping
from typing import Any

from porter.errors import ConfigError


def parse_toml(text: str, where: str) -> dict[str, Any]:
    """``text`` as TOML; a syntax error is an ERROR naming ``where``."""
    try:
        return tomllib.loads(text)
    except (ValueError, RecursionError) as exc:  # a TOMLDecodeError, or a number past the int-from-string limit
        why = "arrays or inline tables nested too deeply" if isinstance(exc, RecursionError) else exc
        raise ConfigError(f"{where}: invalid TOML: {why}", hint="fix the file's syntax") from None


def whole_number(value: Any, low: int = -(2 ** 63)) -> bool:
    """An integer of at least ``low`` that TOML can hold: 64-bit (tomllib reads wider ones, a 0x... of any length,
    which a message would then show in full) and never a bool."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value < 2 ** 63


def check_keys(data: Mapping[str, Any], known: Collection[str], where: str, *, table: str = "",
               required: Collection[str] = ()) -> None:
    """Refuse a key of ``data`` that is not ``known`` (naming the closest known one) and a ``required`` one that
    is missing. ``table``: the TOML table ``data`` is, for the message (``[slurm]``)."""
    place = f" in [{table}]" if table else ""
    for key in data:
        if key not in known:
            close = difflib.get_close_matches(key, list(known), n=1)
            raise ConfigError(f"{where}: unknown key {key!r}{place}" + (f" (did you mean {close[0]!r}?)" if close else ""),
                              hint=f"known keys{place}: {', '.join(sorted(known))}")
    missing = sorted(k for k in required if k not in data)
    if missing:
        raise ConfigError(f"{where}: missing key {missing[0]!r}{place}", hint=f"add {missing[0]} = ...")
