"""The one typed manifest, and the one function that builds it.

Every wheel porter produces gets a sidecar ``<wheel>.porter.json`` (schema below): what it was built
for (toolchain, archs, wavefront, CPU ISA, torch), from what (source hashes) and what is inside
(per-extension sha256). Install and verify read it back.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from porter import __version__
from porter.artifacts import labels
from porter.errors import ConfigError, from_os_error
from porter.fs import atomic_write_json, owned_temp, sha256_file

if TYPE_CHECKING:
    from porter.toolchain.profile import Toolchain
    from porter.torch_facts import TorchInfo

SCHEMA = "porter.manifest/1"
SUFFIX = ".porter.json"


class ExtensionEntry(TypedDict):
    module: str            # importable name, e.g. deepspeed.ops.adam.cpu_adam_op
    path: str              # path inside the wheel
    sha256: str
    op: NotRequired[str]
    archs: NotRequired[list[str]]
    host_only: NotRequired[bool]   # no device code: verify expects no code objects in it


class OpEntry(TypedDict):
    name: str
    status: str            # built | failed | skipped | cached
    seconds: NotRequired[float]
    log: NotRequired[str]
    reason: NotRequired[str]


class Manifest(TypedDict):
    schema: str
    porter_version: str
    component: str         # deepspeed | apex | flash-attn | megatron-fused-kernels
    version: str           # full PEP 440 version of the wheel, local label included
    wheel: dict[str, str]  # filename, sha256
    python_tag: str
    toolchain: dict[str, Any]
    target: dict[str, Any]  # kind, archs, wavefront, cpu_isa, rocm_version / cuda_version
    torch: dict[str, Any]   # version, kind, hip, cuda, cxx11_abi
    sources: dict[str, Any]  # origin, version, sdist_sha256 | git_commit | tree, patches (list of PatchRecord dicts)
    extensions: list[ExtensionEntry]
    ops: NotRequired[list[OpEntry]]
    build: NotRequired[dict[str, Any]]   # how it was built (compiler cache: identity, hits, misses)
    wave64: NotRequired[dict[str, Any]]  # a 64-lane build: each warp-size-32 finding with its state (hipify/wave64)


def target_of(tc: Toolchain, **extra: Any) -> dict[str, Any]:
    """The one ``target`` section: what a wheel was built for."""
    return {"kind": tc.kind, "archs": list(tc.arch_names), "arch_specs": list(tc.archs), "wavefront": tc.wavefront,
            "cpu_isa": tc.cpu_isa, "toolkit_version": tc.toolkit_version, "label": labels.make(tc)} | extra


def build_manifest(*, component: str, version: str, tc: Toolchain, torch: TorchInfo | None, python_tag: str,
                   sources: dict[str, Any], extensions: list[ExtensionEntry], ops: list[OpEntry] | None = None,
                   target: dict[str, Any] | None = None) -> Manifest:
    """Every manifest porter writes (its ``wheel`` section is filled in by :func:`publish`)."""
    manifest: Manifest = {
        "schema": SCHEMA, "porter_version": __version__, "component": component, "version": version,
        "wheel": {}, "python_tag": python_tag, "toolchain": tc.to_dict(),
        "target": target_of(tc, **(target or {})),
        "torch": _torch(torch),
        "sources": dict(sources), "extensions": extensions,
    }
    if ops is not None:
        manifest["ops"] = ops
    return manifest


def _torch(torch: TorchInfo | None) -> dict[str, Any]:
    """The torch a wheel was built against, with its C++ ABI: a build's torch is always probed, so it is known
    here (an installed torch read from its version.py, as install sees one, does not know it)."""
    if torch is None:
        return {"version": None, "kind": None, "hip": None, "cuda": None}
    return {**torch.to_dict(), "cxx11_abi": torch.cxx11_abi}


def carried(manifest: Manifest) -> bytes:
    """The copy a wheel carries in its .dist-info: what the wheel *is*, nothing about one build of it, so
    the same inputs give the same bytes. Left out: the ``wheel`` section (a wheel cannot hash itself), the
    ``build`` section (cache hits), and per-op times, logs and built-vs-cached (the sidecar keeps them)."""
    doc: dict[str, Any] = {k: v for k, v in manifest.items() if k not in ("wheel", "build")}
    if "ops" in doc:
        doc["ops"] = [{"name": o["name"], "status": "built" if o["status"] in ("built", "cached") else o["status"],
                       **({"reason": o["reason"]} if "reason" in o else {})} for o in doc["ops"]]
    return json.dumps(doc, indent=2, sort_keys=True).encode()


def publish(dest_dir: Path, write: Callable[[Path, bytes], Path], *, extra: Mapping[str, Any] | None = None,
            **fields: Any) -> tuple[Path, Path, Manifest]:
    """The one way an artifact (a wheel, a plugin package) reaches porter's output folder, with its manifest.

    The manifest is made of ``fields`` (:func:`build_manifest`) and the sections ``extra`` adds (``wave64``,
    ``build``); ``write(folder, carried)`` writes the artifact, carrying the manifest's bytes, into a temp folder
    beside ``dest_dir``. The manifest is written beside it, then both are renamed in, the artifact last: it never
    appears without its manifest, and nothing half-written is left. Returns the artifact, its manifest's path and
    the manifest."""
    manifest = build_manifest(**fields)
    manifest.update(extra or {})  # type: ignore[typeddict-item]
    dest_dir.mkdir(parents=True, exist_ok=True)
    with owned_temp(dest_dir, ".porter-") as tmp:
        out = write(tmp, carried(manifest))
        final = dest_dir / out.name
        manifest["wheel"] = {"filename": out.name, "sha256": sha256_file(out)}
        atomic_write_json(manifest_path(out), manifest)
        os.replace(manifest_path(out), manifest_path(final))
        os.replace(out, final)
    return final, manifest_path(final), manifest


def manifest_path(wheel: str | os.PathLike[str]) -> Path:
    wheel = Path(wheel)
    return wheel.with_name(wheel.name + SUFFIX)


def read_manifest(path: str | os.PathLike[str]) -> Manifest:
    path = Path(path)
    corrupt = "rebuild the wheel with porter; a manifest is never edited by hand"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"manifest missing: {path}",
                          hint="rebuild the wheel with porter, or remove it from the wheelhouse") from None
    except IsADirectoryError:
        raise ConfigError(f"manifest corrupt: {path} is a folder, not a file", hint=corrupt) from None
    except OSError as exc:  # no permission, an I/O error: the cause and the path
        raise from_os_error(exc) from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, a number past Python's int-from-string limit
        raise ConfigError(f"manifest corrupt: {path}: {exc}", hint=corrupt) from None
    except RecursionError:
        raise ConfigError(f"manifest corrupt: {path}: nested too deeply", hint=corrupt) from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ConfigError(f"manifest {path} is not a {SCHEMA} document",
                          hint="rebuild the wheel with this porter version")
    for key in ("component", "version", "wheel", "target", "extensions"):
        if key not in data:
            raise ConfigError(f"manifest {path} lacks the key {key!r}", hint="rebuild the wheel with porter")
    # the sections its readers index (install, verify, the matrix report), with the types they index them as
    for key, kind in _SECTIONS.items():
        if key in data and not isinstance(data[key], kind):
            raise ConfigError(f"manifest corrupt: {path}: {key!r} is a {type(data[key]).__name__}, not a "
                              f"{kind.__name__}", hint=corrupt)
    for key in ("extensions", "ops"):
        if not all(isinstance(entry, dict) for entry in data.get(key, [])):
            raise ConfigError(f"manifest corrupt: {path}: an entry of {key!r} is not an object", hint=corrupt)
    return data  # type: ignore[return-value]


_SECTIONS: dict[str, type] = {"component": str, "version": str, "wheel": dict, "toolchain": dict, "target": dict,
                              "torch": dict, "sources": dict, "extensions": list, "ops": list, "build": dict}
