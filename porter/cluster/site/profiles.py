"""Site profiles: what a cluster's compute nodes look like and what a training job there needs.

A site is data (``porter/cluster/site/builtin/<name>.toml``, or any TOML file with the same keys): the node
layout (GPUs, GCDs per GPU, memory per device, cores per device, NUMA and NIC binding), the runtime
environment (modules, RCCL/libfabric variables, MIOpen's cache on node-local storage, HSA, OMP), the
scheduler's defaults and where the RCCL network plugin lives. Each built-in file names the public
documents its facts come from (``source``). Unknown keys are errors that name the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from porter.errors import ConfigError, shown
from porter.fs import exists, read_user_text
from porter.toolchain.archs import parse_target
from porter.userdata import check_keys, parse_toml, whole_number


@dataclass(frozen=True, kw_only=True)
class NodeLayout:
    """One compute node as Slurm and the ROCm runtime see it."""

    gpus: int
    """GPU packages per node (MI250X OAMs, MI300X cards)."""
    gcds_per_gpu: int = 1
    """Devices per package: 2 for MI250X (each GCD is a GPU to Slurm and ROCr), 1 for MI300X."""
    device_memory_gib: float
    """HBM per device (per GCD), GiB."""
    arch: str
    """GPU arch of every device (``gfx90a``)."""
    cores: int
    """Physical CPU cores per node."""
    cores_per_gcd: int
    """Cores a rank (one device) may use: ``--cpus-per-task`` and ``OMP_NUM_THREADS``."""
    numa_of_gcd: tuple[int, ...] = ()
    """NUMA domain closest to device 0, 1, ... (empty: unknown)."""
    nics: tuple[str, ...] = ()
    """High-speed NICs (``hsn0`` ...); what ``NCCL_SOCKET_IFNAME`` names."""
    gcds_per_nic: int = 0
    """Devices that share one NIC (0: unknown)."""
    cpu_bind: str = ""
    """``srun --cpu-bind=`` value that puts rank i on the cores closest to device i."""
    gpu_bind: str = ""
    """``srun --gpu-bind=`` value (``closest``); empty: none."""
    local_dir: str = "/tmp"
    """Node-local storage for caches (MIOpen's user DB); may use ``$USER``, ``$SLURM_JOB_ID``."""
    nvme: str = ""
    """Node-local NVMe the Python environment can be broadcast to (``sbcast``); empty: none."""
    nvme_sbatch: tuple[str, ...] = ()
    """sbatch options that grant the NVMe (``--constraint=nvme``)."""

    @property
    def devices(self) -> int:
        """Devices (GCDs) per node: what one rank each uses."""
        return self.gpus * self.gcds_per_gpu


@dataclass(frozen=True, kw_only=True)
class Runtime:
    """What every rank's environment needs."""

    modules: tuple[str, ...] = ()
    """``module load`` lines, in order (skipped where no ``module`` command exists)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables every rank gets (RCCL, libfabric, HSA). ``$VAR`` is expanded by the job's shell."""
    miopen_dir: str = "${PORTER_LOCAL_DIR}/${USER:-$(id -un)}-miopen-${SLURM_JOB_ID}"
    """MIOpen's user DB and custom cache (``MIOPEN_USER_DB_PATH``, ``MIOPEN_CUSTOM_CACHE_DIR``): on
    node-local storage, so thousands of ranks never share one SQLite file on a parallel filesystem."""
    master_port: int = 3442
    """``MASTER_PORT`` of torch.distributed's rendezvous."""


@dataclass(frozen=True, kw_only=True)
class Scheduler:
    """Slurm defaults of a training job at this site (the command line wins)."""

    partition: str = ""
    qos: str = ""
    time: str = "2:00:00"
    sbatch_args: tuple[str, ...] = ()
    """More sbatch options every training job gets (``--network=disable_rdzv_get``)."""
    request_gpus: bool = True
    """Write ``--gpus-per-node``: false where GPUs come with the whole node and no GRES is defined."""
    max_nodes: int = 0
    """The largest job the default partition takes (0: no limit known)."""


@dataclass(frozen=True, kw_only=True)
class Plugin:
    """The RCCL network plugin (libfabric) a multi-node job loads."""

    name: str
    """``aws-ofi-nccl`` or ``aws-ofi-rccl``."""
    version: str = ""
    module: str = ""
    """The site module that provides it (sets ``NCCL_NET_PLUGIN``); empty: none."""
    library: str = ""
    """Path of the plugin library where the site installs it; may use ``$VAR``. Empty: from ``env_var``."""
    env_var: str = "NCCL_NET_PLUGIN"
    """The variable RCCL reads the plugin's path (or name) from."""
    rccl_major: int = 0
    """RCCL major version the site runs; a plugin built against another major is refused (0: any)."""


@dataclass(frozen=True, kw_only=True)
class Site:
    name: str
    description: str = ""
    source: str
    """The public documents the facts come from (repository, commit, files)."""
    toolchain: str = ""
    """The toolchain preset the site's wheels are built with."""
    node: NodeLayout
    runtime: Runtime = field(default_factory=Runtime)
    scheduler: Scheduler = field(default_factory=Scheduler)
    plugin: Plugin | None = None
    file: str = ""
    """Where the profile was read from."""

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["node"]["devices"] = self.node.devices
        return d


# -- loading ----------------------------------------------------------------------------------------------

def site_names() -> list[str]:
    folder = resources.files("porter.cluster.site").joinpath("builtin")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def load_site(ref: str | os.PathLike[str]) -> Site:
    """A built-in site by name, or a TOML file (a path ending in ``.toml`` or naming an existing file)."""
    text_ref = os.fspath(ref)
    path = Path(text_ref)
    if text_ref.endswith(".toml") or os.sep in text_ref or exists(path, file=True):
        if not exists(path, file=True):
            raise ConfigError(f"site file {path} does not exist", hint="pass a built-in site name or a TOML file")
        text = read_user_text(path, str(path), kind="a site profile (TOML)",
                              unreadable_hint="pass a readable TOML file or a built-in site name")
        return _parse(text, name=path.stem, where=str(path), file=str(path.resolve()))
    names = site_names()
    if text_ref not in names:
        close = difflib.get_close_matches(text_ref, names, n=3, cutoff=0.5)
        raise ConfigError(f"unknown site {text_ref!r}" + (f" (did you mean {', '.join(map(repr, close))}?)"
                                                          if close else ""),
                          hint=f"built-in sites: {', '.join(names)}; or pass a site TOML file "
                               "('porter site list')")
    res = resources.files("porter.cluster.site").joinpath("builtin").joinpath(f"{text_ref}.toml")
    return _parse(res.read_text(), name=text_ref, where=f"site {text_ref}", file=str(res))


_TABLES: dict[str, type[Any]] = {"node": NodeLayout, "runtime": Runtime, "scheduler": Scheduler, "plugin": Plugin}


def _parse(text: str, *, name: str, where: str, file: str) -> Site:
    data = parse_toml(text, where)
    data.setdefault("name", name)
    check_keys(data, {f.name for f in dataclasses.fields(Site)} - {"file"}, where)
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key in _TABLES:
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: [{key}] must be a table", hint=f"write it as a [{key}] section")
            values[key] = _table(_TABLES[key], value, where, key)
        else:
            if not isinstance(value, str):
                raise ConfigError(f"{where}: {key} must be a string, not {shown(value)}")
            values[key] = value
    if "node" not in values:
        raise ConfigError(f"{where}: no [node] table", hint="a site names its node layout (gpus, arch, cores ...)")
    if "source" not in values or not values["source"].strip():
        raise ConfigError(f"{where}: no source", hint="name the public documents the facts come from")
    site = Site(**values, file=file)
    _validate(site, where)
    return site


def _table(cls: type[Any], data: Mapping[str, Any], where: str, table: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    check_keys(data, set(fields), where, table=table)
    values: dict[str, Any] = {}
    for key, value in data.items():
        fits, what, convert = _KINDS[str(fields[key].type)]
        if not fits(value):
            raise ConfigError(f"{where}: [{table}] {key} must be {what}, not {shown(value)}")
        values[key] = convert(value)
    try:
        return cls(**values)
    except TypeError as exc:  # a required key is missing
        missing = [n for n, f in fields.items() if n not in values and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        raise ConfigError(f"{where}: [{table}] lacks {', '.join(missing) or exc}") from None


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


_KINDS: dict[str, tuple[Callable[[Any], bool], str, Callable[[Any], Any]]] = {
    "int": (whole_number, "a whole number", int),
    "float": (lambda v: (whole_number(v) or isinstance(v, float)) and math.isfinite(v), "a number", float),
    "bool": (lambda v: isinstance(v, bool), "true or false", bool),
    "str": (lambda v: isinstance(v, str), "a string", str),
    "tuple[int, ...]": (lambda v: isinstance(v, list) and all(map(whole_number, v)), "a list of whole numbers", tuple),
    "tuple[str, ...]": (_strings, "a list of strings", tuple),
    "Mapping[str, str]": (lambda v: isinstance(v, dict) and _strings(list(v.values())), "a table of strings", dict),
}
"""What a field of each type accepts from TOML, how a refusal names it, and the value the field holds."""


def _validate(site: Site, where: str) -> None:
    n = site.node
    for key in ("gpus", "gcds_per_gpu", "cores", "cores_per_gcd"):
        if getattr(n, key) < 1:
            raise ConfigError(f"{where}: [node] {key} must be >= 1, not {getattr(n, key)}")
    if n.device_memory_gib <= 0:
        raise ConfigError(f"{where}: [node] device_memory_gib must be > 0")
    try:
        parse_target(n.arch)
    except ConfigError as exc:  # an unknown arch: the error has the close matches
        raise ConfigError(f"{where}: [node] arch: {exc.message}", hint=exc.hint) from None
    if n.cores_per_gcd * n.devices > n.cores:
        raise ConfigError(f"{where}: [node] {n.devices} devices x {n.cores_per_gcd} cores_per_gcd is more than "
                          f"the node's {n.cores} cores")
    if n.numa_of_gcd and len(n.numa_of_gcd) != n.devices:
        raise ConfigError(f"{where}: [node] numa_of_gcd lists {len(n.numa_of_gcd)} devices, the node has {n.devices}")
    for key in ("MIOPEN_USER_DB_PATH", "MIOPEN_CUSTOM_CACHE_DIR", "OMP_NUM_THREADS"):
        if key in site.runtime.env:
            raise ConfigError(f"{where}: [runtime.env] sets {key}, which porter derives",
                              hint="set [runtime] miopen_dir / [node] local_dir and cores_per_gcd instead")
    for arg in site.scheduler.sbatch_args + n.nvme_sbatch:
        if not arg.startswith("-"):
            raise ConfigError(f"{where}: sbatch option {arg!r} does not start with '-'")


def runtime_env(site: Site) -> dict[str, str]:
    """Every variable a rank of this site gets, in the order the job script exports them (values may
    name ``$VAR``s the job's shell expands): the site's own, then what porter derives."""
    env = {**site.runtime.env, "PORTER_LOCAL_DIR": site.node.local_dir, "MIOPEN_USER_DB_PATH": site.runtime.miopen_dir,
           "MIOPEN_CUSTOM_CACHE_DIR": "${MIOPEN_USER_DB_PATH}", "OMP_NUM_THREADS": str(site.node.cores_per_gcd)}
    if site.plugin is not None and site.plugin.library:
        env[site.plugin.env_var] = site.plugin.library
    return env
