"""Toolchain profiles: what to build with and for. Frozen, validated, never guessed.

A profile comes from a built-in preset (data in ``presets/*.toml``) or a TOML file (which may
``extends`` a preset), then ``PORTER_*`` environment variables, then command-line overrides: CLI >
env > file > preset. Unknown keys are errors that name the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from porter.errors import ConfigError
from porter.fs import exists, read_user_text
from porter.toolchain.archs import Target, parse_target, wavefront_of
from porter.userdata import check_keys, parse_toml

if TYPE_CHECKING:
    from porter.executor import Executor

Kind = Literal["rocm", "cuda", "cpu", "emulated"]
KINDS: tuple[str, ...] = ("rocm", "cuda", "cpu", "emulated")
_ISA = re.compile(r"^[a-z0-9][a-z0-9._+-]*$")


@dataclass(frozen=True, kw_only=True)
class Toolchain:
    """One build target. Every field is explicit: nothing is read from the build host's GPU."""

    name: str
    """Profile name (preset name or file stem)."""
    kind: Kind
    """rocm, cuda, cpu, or emulated: porter's HIP target on the CPU (hipified kernels compiled by the host compiler
    with porter's HIP-on-CPU headers, run with wavefronts of the arch's width: ``wave64``, ``wave32``)."""
    description: str = ""
    """One line for humans."""
    toolkit_version: str = ""
    """ROCm or CUDA version the profile targets (``5.7``, ``6.2``, ``13.0``); names the wheel label."""
    root: str = ""
    """ROCm / CUDA install root as the compiler sees it (inside the launcher, if any)."""
    compiler: str = ""
    """Device compiler (``hipcc``, ``amdclang++``, ``nvcc``) or, for cpu, the C++ compiler."""
    compiler_version: str = ""
    """PEP 440 specifier the compiler's version must satisfy (``>=5.7,<5.8``); empty = any."""
    cxx: str = "g++"
    """Host C++ compiler."""
    hip_cxx: str = ""
    """rocm: the C++ compiler for the host translation units of GPU ops (their bindings include HIP headers).
    ROCm 7's ``hip_bf16.h`` is clang-only (``ext_vector_type``; GCC fails its static assertions), so ROCm 7
    presets name the toolchain's own clang++ (``amdclang++``); empty: ``cxx``. CPU-only ops always use ``cxx``."""
    archs: tuple[str, ...] = ()
    """GPU targets: ``gfx90a``, ``gfx90a:xnack-``, ``sm_90``. Empty for cpu."""
    cpu_isa: str = "x86-64-v2"
    """Host ISA for ``-march=`` (``x86-64-v3``, ``znver3``); ``native`` only when asked."""
    cflags: tuple[str, ...] = ()
    """Extra compiler flags for every compile."""
    defines: tuple[str, ...] = ()
    """Extra preprocessor defines, ``NAME`` or ``NAME=VALUE``."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment for the toolchain's programs (``HIP_PLATFORM=amd``)."""
    launcher: tuple[str, ...] = ()
    """argv prefix that runs the toolchain's programs elsewhere: ``chroot DIR``, ``apptainer exec IMG``."""
    launcher_root: str = ""
    """Host path of the root a non-chroot launcher runs in; porter's work dirs go under it."""
    setup: str = ""
    """The command that makes the launcher's root (``make chroot-trixie``), named when it is missing."""
    python: str = ""
    """The build python as the launcher sees it (a python with torch inside the chroot/container).
    Empty: porter's own python on the host; files it names are staged into the root."""

    def __post_init__(self) -> None:
        _validate(self)

    # -- derived -----------------------------------------------------------------------------
    @property
    def targets(self) -> tuple[Target, ...]:
        return tuple(parse_target(a) for a in self.archs)

    @property
    def compiler_line(self) -> str:
        """What measured compile costs and unit times are kept per: ``rocm7.2``, ``cuda13.0``, ``cpu``."""
        return f"{self.kind}{self.toolkit_version}" if self.toolkit_version else self.kind

    @property
    def hip(self) -> bool:
        """Whether CUDA sources are hipified and built with ROCm's defines (rocm, and the emulated HIP target)."""
        return self.kind in ("rocm", "emulated")

    @property
    def gpu(self) -> bool:
        """Whether the profile builds device code (every kind but cpu)."""
        return self.kind != "cpu"

    @property
    def arch_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t.name for t in self.targets))

    @property
    def wavefront(self) -> int | None:
        """Wavefront (warp) size baked into device code; None for cpu."""
        return None if self.kind == "cpu" else wavefront_of(self.targets)

    @property
    def executor(self) -> Executor:
        """Where the toolchain's programs run (host, chroot, container): the one owner of argv
        prefixes and of host <-> in-root paths."""
        from porter.executor import make_executor
        from porter.fs import cache_dir

        major = self.toolkit_version.split(".")[0]
        return make_executor(self.launcher, self.launcher_root, work_root=cache_dir(),
                             needs_proc=self.kind == "rocm" and major.isdigit() and int(major) >= 7,
                             setup=self.setup)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        return {**d, "env": dict(self.env), **{k: list(d[k]) for k in _LIST_FIELDS}, "wavefront": self.wavefront}


FIELDS: dict[str, dataclasses.Field[Any]] = {f.name: f for f in dataclasses.fields(Toolchain)}
_LIST_FIELDS = {"archs", "cflags", "defines", "launcher"}


def _validate(tc: Toolchain) -> None:
    where = f"toolchain {tc.name!r}"
    if tc.kind not in KINDS:
        raise ConfigError(f"{where}: kind must be one of {', '.join(KINDS)}, not {tc.kind!r}")
    if not tc.compiler:
        raise ConfigError(f"{where}: no compiler given", hint="set compiler = \"hipcc\" / \"nvcc\" / \"g++\"")
    if not _ISA.match(tc.cpu_isa):
        raise ConfigError(f"{where}: cpu_isa {tc.cpu_isa!r} is not a -march value",
                          hint="use e.g. x86-64-v2, x86-64-v3, znver3, znver4")
    targets = tc.targets  # parses: unknown arch -> error with close matches
    vendor = {"rocm": "amd", "cuda": "nvidia", "emulated": "emulated"}.get(tc.kind)
    if tc.kind == "cpu":
        if targets:
            raise ConfigError(f"{where}: a cpu profile takes no GPU archs (got {', '.join(tc.archs)})")
    else:
        if not targets:
            raise ConfigError(f"{where}: a {tc.kind} profile needs at least one arch",
                              hint="e.g. archs = [\"gfx90a\"], [\"sm_90\"] or [\"wave64\"] (emulated); detection never "
                                   "fills this in")
        wrong = [t.spec for t in targets if t.arch.vendor != vendor]
        if wrong:
            raise ConfigError(f"{where}: {', '.join(wrong)} are not {tc.kind} archs")
        wavefront_of(targets)  # mixing wave32 and wave64 -> error that explains why
        if tc.kind == "emulated" and len(targets) != 1:
            raise ConfigError(f"{where}: an emulated profile runs one wavefront size (wave64 or wave32), not "
                              f"{', '.join(tc.archs)}", hint="make one profile per wavefront size")
    if tc.compiler_version:
        from packaging.specifiers import SpecifierSet
        try:
            for one in SpecifierSet(tc.compiler_version):
                one.contains("0", prereleases=True)  # reads its version now, as the compiler check will
        except ValueError:  # InvalidSpecifier, or a number past Python's int-from-string limit
            raise ConfigError(f"{where}: compiler_version {tc.compiler_version!r} is not a version specifier",
                              hint="write it like \">=5.7,<5.8\"") from None
    if bool(tc.launcher_root) and not tc.launcher:
        raise ConfigError(f"{where}: launcher_root is set but launcher is empty")


# -- loading -----------------------------------------------------------------------------------

def preset_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("porter.toolchain").joinpath("presets").iterdir()
                  if p.name.endswith(".toml"))


def _preset_data(name: str) -> dict[str, Any]:
    path = resources.files("porter.toolchain").joinpath("presets").joinpath(f"{name}.toml")
    if not exists(path, file=True):
        close = difflib.get_close_matches(name, preset_names(), n=3)
        raise ConfigError(f"no toolchain preset or file named {name!r}"
                          + (f"; did you mean {', '.join(close)}?" if close else ""),
                          hint="run 'porter toolchain list', or pass a TOML file path")
    return _parse_toml(path.read_text(), f"preset {name}")


def _parse_toml(text: str, where: str) -> dict[str, Any]:
    data = parse_toml(text, where)
    check_keys(data, {*FIELDS, "extends"}, where)
    return data


_VAR = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


def _expand(value: str, environ: Mapping[str, str]) -> str:
    """``${VAR}`` and ``${VAR:-default}`` and a leading ``~``: lets presets name relocatable paths."""
    value = _VAR.sub(lambda m: environ.get(m.group(1)) or (m.group(2) or ""), value)
    # one with a NUL is refused by the caller (_coerce); expanduser would raise ValueError on it
    return value if "\0" in value else os.path.expanduser(value)


def _coerce(data: Mapping[str, Any], where: str, environ: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key in _LIST_FIELDS:
            if isinstance(value, str):
                value = [v for v in re.split(r"[,\s]+", value) if v]
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{where}: {key} must be a list of strings")
            value = tuple(_expand(v, environ) for v in value)
            texts = list(value)
        elif key == "env":
            if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                         for k, v in value.items()):
                raise ConfigError(f"{where}: env must be a table of strings")
            value = {k: _expand(v, environ) for k, v in value.items()}
            texts = [*value, *value.values()]
        elif not isinstance(value, str):
            raise ConfigError(f"{where}: {key} must be a string, not {type(value).__name__}")
        else:
            value = _expand(value, environ)
            texts = [value]
        if any("\0" in t for t in texts):  # no path, flag, argument or variable can hold one
            raise ConfigError(f"{where}: {key} holds a NUL byte (\\0)",
                              hint="a path, flag or name cannot contain NUL; remove it")
        out[key] = value
    return out


def load_toolchain(ref: str | os.PathLike[str] | None = None, *, overrides: Mapping[str, Any] | None = None,
                   environ: Mapping[str, str] | None = None) -> Toolchain:
    """Resolve a profile: ``ref`` is a preset name or a TOML path (default: ``$PORTER_TOOLCHAIN`` or cpu)."""
    environ = os.environ if environ is None else environ
    ref = os.fspath(ref) if ref is not None else environ.get("PORTER_TOOLCHAIN", "cpu")
    layers: list[tuple[str, dict[str, Any]]] = []
    path = Path(ref)
    if ref.endswith(".toml") or os.sep in ref or exists(path, file=True):
        if not exists(path, file=True):
            raise ConfigError(f"toolchain file not found: {ref}", hint="pass an existing TOML file or a preset name")
        # UTF-8, as TOML is; what cannot be read is a ConfigError naming the file
        text = read_user_text(path, str(path), kind="a toolchain profile (TOML)",
                              unreadable_hint="pass a readable TOML file or a preset name")
        data = _parse_toml(text, str(path))
        if (base := data.pop("extends", None)) is not None:
            if not isinstance(base, str):
                raise ConfigError(f"{path}: extends must be a preset name (a string), not {type(base).__name__}",
                                  hint="e.g. extends = \"mi300x\"; 'porter toolchain list' shows the presets")
            layers.append((f"preset {base}", _preset_data(base)))
        where, name = str(path), path.stem
    else:
        data, where, name = _preset_data(ref), f"preset {ref}", ref
    data.setdefault("name", name)
    layers.append((where, data))
    # PORTER_<FIELD> variables that are set and not empty (a list field's value is split by _coerce)
    layers.append(("PORTER_* environment", {k: v for k in FIELDS if k not in ("name", "env")
                                            and (v := environ.get(f"PORTER_{k.upper()}"))}))
    if overrides:
        check_keys(overrides, FIELDS, "command line")
        layers.append(("command line", {k: v for k, v in overrides.items() if v not in (None, (), [])}))
    merged: dict[str, Any] = {}
    for where, layer in layers:
        merged.update(_coerce({k: v for k, v in layer.items() if k != "extends"}, where, environ))
    if "kind" not in merged:  # (the name is the preset's or the file's unless a layer gives one)
        raise ConfigError(f"toolchain {ref!r}: missing required key 'kind'")
    return Toolchain(**merged)


def toolchain_env(tc: Toolchain, extra: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """The environment for the toolchain's programs: a copy of porter's environment plus the profile's env."""
    from porter.run import make_env

    update: dict[str, str | None] = dict(tc.env)
    if tc.kind == "rocm" and tc.root and not tc.launcher:
        update.setdefault("ROCM_PATH", tc.root)
    if tc.kind == "cuda" and tc.root:
        update.setdefault("CUDA_HOME", tc.root)
    update.update(extra or {})
    return make_env(update)
