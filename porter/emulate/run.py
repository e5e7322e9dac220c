"""``porter emulate check``: the numeric checks on what porter built for its emulated HIP target.

The wheels of a wheelhouse whose manifests name an emulated target (``emulate-wave64``, ``emulate-wave32``) are
unpacked into a temp folder per wave size, and :mod:`porter.emulate.checks` runs there in the build python (which
has torch), one process per kernel family, so a kernel that crashes the emulator fails its family alone. What the
checks prove and what they cannot is in docs/emulate.md.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from porter.artifacts.manifest import manifest_path, read_manifest
from porter.emulate import checks
from porter.errors import ConfigError, NothingToDo, PorterError
from porter.fs import owned_temp
from porter.log import Logger, quiet_logger
from porter.run import Runner, make_env


@dataclass
class CheckRun:
    """The rows of every check (``checks.Checks`` rows), and the wheels each wave size was checked from."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    wheels: dict[int, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.rows) and all(r["ok"] for r in self.rows)

    def summary(self) -> list[dict[str, Any]]:
        """One line per kernel family and wave size: its worst check (largest error against its tolerance)."""
        out: dict[tuple[str, int], dict[str, Any]] = {}
        for r in self.rows:
            key = (r["kernel"], r["wave"])
            seen = out.get(key)
            worst = r if seen is None or _ratio(r) > seen["ratio"] else seen
            out[key] = {**worst, "ratio": _ratio(worst), "checks": (seen or {}).get("checks", 0) + 1,
                        "ok": (seen is None or seen["ok"]) and bool(r["ok"])}
        return [out[k] for k in sorted(out, key=lambda k: (k[1], k[0]))]


def _ratio(row: dict[str, Any]) -> float:
    if row.get("max_abs_err") is None or not row.get("tolerance"):
        return float("inf")
    return float(row["max_abs_err"]) / float(row["tolerance"])


def emulated_wheels(wheelhouse: Path) -> dict[int, list[Path]]:
    """The wheels of ``wheelhouse`` built for the emulated target, by wave size (read from their manifests)."""
    if not wheelhouse.is_dir():
        raise ConfigError(f"wheelhouse not found: {wheelhouse}",
                          hint="pass the folder 'porter ops build' or 'porter port' wrote with -t emulate-wave64")
    out: dict[int, list[Path]] = {}
    for whl in sorted(wheelhouse.glob("*.whl")):
        if not manifest_path(whl).is_file():
            continue
        target = dict(read_manifest(manifest_path(whl)).get("target") or {})
        if target.get("kind") == "emulated" and target.get("wavefront") in (32, 64):
            out.setdefault(int(target["wavefront"]), []).append(whl)
    return out


def unpack(wheel: Path, dest: Path) -> None:
    """A wheel's files under ``dest``; a member that would land outside it is refused."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            for info in zf.infolist():
                name = PurePosixPath(info.filename)
                if name.is_absolute() or ".." in name.parts:
                    raise ConfigError(f"{wheel}: member {info.filename!r} would be written outside the folder",
                                      hint="rebuild the wheel with porter; do not check wheels from elsewhere")
                zf.extract(info, dest)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ConfigError(f"{wheel} cannot be read as a wheel: {exc}", hint="build it again") from None


def check_wheelhouse(wheelhouse: Path, *, python: str, only: list[str] | None = None,
                     log: Logger | None = None, runner: Runner | None = None) -> CheckRun:
    """Run every family's checks on the emulated wheels of ``wheelhouse``, per wave size."""
    log = log or quiet_logger()
    runner = runner or Runner(log, echo=log.verbose)
    groups = emulated_wheels(wheelhouse)
    if not groups:
        raise NothingToDo(f"no wheel built for porter's emulated HIP target in {wheelhouse}",
                          hint="build one first: porter port megatron-deepspeed TREE -t emulate-wave64 -o DIR, or "
                               "porter ops build --source deepspeed==X -t emulate-wave64 --ops fused_adam -o DIR")
    result = CheckRun()
    for wave, wheels in sorted(groups.items()):
        result.wheels[wave] = [w.name for w in wheels]
        with owned_temp(None, f"porter-emulate-{wave}-") as tmp:
            site = tmp / "site"
            for whl in wheels:
                unpack(whl, site)
            families = [f for f, module in checks.FAMILIES.items()
                        if (not only or f in only) and _has_module(site, module)]
            if not families:
                log.warn(f"wave {wave}: the wheels hold no module of a kernel family porter checks "
                         f"({', '.join(checks.FAMILIES)})")
            for family in families:
                with log.step(f"checking {family} at wave {wave}"):
                    result.rows += _run_family(family, wave, site, tmp, python=python, runner=runner)
    if not result.rows:
        raise NothingToDo(f"the emulated wheels in {wheelhouse} hold no kernel porter checks"
                          + (f" among {', '.join(only)}" if only else ""),
                          hint="build the Megatron kernels (porter port) or DeepSpeed's fused optimizers")
    return result


def _has_module(site: Path, module: str) -> bool:
    *parents, leaf = module.split(".")
    folder = site.joinpath(*parents)
    return folder.is_dir() and any(p.name.startswith(leaf + ".") and p.suffix == ".so" for p in folder.iterdir())


def _run_family(family: str, wave: int, site: Path, tmp: Path, *, python: str, runner: Runner) -> list[dict[str, Any]]:
    out = tmp / f"{family}.json"
    argv = [python, checks.__file__, "--device", "cpu", "--wave", str(wave), "--only", family, "--out", str(out)]
    try:
        res = runner.run(argv, env=make_env({"PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1"}),
                         cwd=tmp, timeout=1800, check=False)
    except PorterError as exc:  # a timeout: the family fails, the others still run
        return [_failed(family, wave, exc.message)]
    if res.ok and out.is_file():
        rows: list[dict[str, Any]] = json.loads(out.read_text())
        return rows
    return [_failed(family, wave, f"the checks exited {res.returncode}: {res.output[-1500:]}")]


def _failed(family: str, wave: int, why: str) -> dict[str, Any]:
    return {"kernel": family, "check": "run the family's checks", "wave": wave, "max_abs_err": None,
            "tolerance": None, "ok": False, "error": why}
