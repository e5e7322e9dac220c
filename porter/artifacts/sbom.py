"""The SBOM every porter wheel carries (PEP 770): ``<name>.dist-info/sboms/porter.cdx.json``, CycloneDX JSON.

:func:`document` turns the manifest a wheel carries (:func:`porter.artifacts.manifest.carried`) into the SBOM's
bytes, with cyclonedx-python-lib: the wheel (name, version, purl) as the BOM's subject; the upstream source it was
built from (sdist sha256, git commit, tree digest) as its ancestor and each patch porter applied to it as its
patches; the extension modules inside it with their sha256; the torch they link against; porter and the toolchain
(compiler, ROCm / CUDA) as the tools; archs, wavefront, CPU ISA and the torch ABI as ``porter:`` properties.
The same manifest gives the same bytes: the timestamp is the build's (``SOURCE_DATE_EPOCH``, else 1980-01-01,
as the wheel's entries) and the serial number a UUID5 of the document's own content.

:func:`read_sbom` reads it back from a wheel (or a net-plugin package) and :func:`describe` says it in words.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import tarfile
import uuid
import zipfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from cyclonedx.model import HashAlgorithm, HashType, Property
from cyclonedx.model.bom import Bom, BomMetaData
from cyclonedx.model.component import Commit, Component, ComponentType, Patch, PatchClassification, Pedigree
from cyclonedx.model.issue import IssueClassification, IssueType
from cyclonedx.model.tool import ToolRepository
from cyclonedx.output import make_outputter
from cyclonedx.schema import OutputFormat, SchemaVersion
from packageurl import PackageURL
from packaging.utils import canonicalize_name

from porter import archive
from porter.errors import ConfigError

NAME = "porter.cdx.json"
"""The SBOM's file name: a net-plugin package carries it beside its ``porter.json``."""
WHEEL_PATH = f"sboms/{NAME}"
"""Its path under a wheel's .dist-info folder (PEP 770). The wheel writer imports this module only when it
writes or rewrites a wheel (cyclonedx takes a tenth of a second to import)."""
SPEC = "1.6"
"""The CycloneDX version written: the newest that every cyclonedx-python-lib porter accepts (>= 8) can write."""
_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "urn:porter:sbom")
"""UUID5 namespace of porter's SBOM serial numbers (fixed: a serial depends only on the document)."""
_PENDING = uuid.UUID(int=0)


def document(manifest: Mapping[str, Any], *, name: str = "", version: str = "", epoch: int,
             purl_type: str = "pypi") -> bytes:
    """The CycloneDX JSON of the wheel (distribution ``name`` and ``version``; default: the manifest's component
    and version) that carries ``manifest``; ``epoch``: the build's timestamp (seconds since 1970); ``purl_type``:
    ``generic`` for what is not a Python distribution (a net-plugin package)."""
    return _serialized(lambda serial: _bom(manifest, name or str(manifest.get("component") or "unknown"),
                                           version or str(manifest.get("version") or ""), epoch, serial, purl_type))


def image_document(parts: Iterable[tuple[str, str, Mapping[str, Any], str]], *, name: str, epoch: int) -> bytes:
    """The combined CycloneDX JSON of an image: the image as the subject, and each part (distribution, version, its
    manifest, its purl type: ``pypi`` for an installed wheel, ``generic`` for what is no Python distribution, a
    network plugin) as a component with what its own SBOM holds, its references prefixed with its name so they
    stay unique; the wheels first; the tools of every part, once."""
    items = sorted(parts, key=lambda p: (p[3] != "pypi", p[0], p[1]))

    def make(serial: uuid.UUID) -> Bom:
        image = Component(type=ComponentType.CONTAINER, name=name, bom_ref="image",
                          description="a node-ready image porter built: what is below installed and verified in it")
        tools: dict[tuple[str, str], Component] = {}
        bom = Bom(serial_number=serial, metadata=BomMetaData(
            timestamp=_dt.datetime.fromtimestamp(epoch, _dt.timezone.utc), component=image))
        wheels_in: list[Component] = []
        for dist, ver, manifest, purl_type in items:
            one = _bom(manifest, dist, ver, epoch, _PENDING, purl_type)
            wheel = one.metadata.component
            assert wheel is not None
            for c in [wheel, *_walk(wheel.components), *_walk(one.components)]:
                c.bom_ref.value = f"{canonicalize_name(dist)}/{c.bom_ref.value}"
            wheels_in.append(wheel)
            for part in one.components:
                bom.components.add(part)
                bom.register_dependency(part)
            bom.register_dependency(wheel, list(one.components))
            for tool in one.metadata.tools.components:
                tools.setdefault((tool.name, str(tool.version or "")), tool)
        bom.components.update(wheels_in)
        for i, tool in enumerate(tools.values()):
            tool.bom_ref.value = f"tool:{i}:{tool.name}"
        bom.metadata.tools = ToolRepository(components=list(tools.values()))
        bom.register_dependency(image, wheels_in)
        return bom

    return _serialized(make)


def _serialized(make: Callable[[uuid.UUID], Bom]) -> bytes:
    """The JSON of the BOM ``make(serial)`` gives, its serial number a UUID5 of the document made with a zero one."""

    def render(serial: uuid.UUID) -> bytes:
        out = make_outputter(make(serial), OutputFormat.JSON, SchemaVersion.V1_6)
        return out.output_as_string(indent=2).encode() + b"\n"

    return render(uuid.uuid5(_NAMESPACE, hashlib.sha256(render(_PENDING)).hexdigest()))


def _walk(components: Iterable[Component]) -> list[Component]:
    return [x for c in components for x in (c, *_walk(c.components))]


# -- the document ---------------------------------------------------------------------------------

def _bom(m: Mapping[str, Any], name: str, version: str, epoch: int, serial: uuid.UUID, purl_type: str) -> Bom:
    sources = _dict(m.get("sources"))
    patches = sources.get("patches")
    records = _entries(patches)
    wheel = Component(
        type=ComponentType.LIBRARY, name=name, version=version or None, bom_ref="wheel",
        purl=PackageURL(type=purl_type, name=canonicalize_name(name) if purl_type == "pypi" else name,
                        version=version or None),
        description=f"{name} {version}, built by porter for +{_dict(m.get('target')).get('label') or '?'}",
        pedigree=Pedigree(ancestors=[_source(m, sources)], patches=[_patch(r) for r in records],
                          notes=None if isinstance(patches, list) else
                          "porter did not record which patches this build applied"),
        properties=[*_props("porter:target", _dict(m.get("target"))),
                    *_props("porter", {"python_tag": m.get("python_tag"), "component": m.get("component")}),
                    *(p for r in records for p in _patch_props(r)),
                    *_wave64_props(_dict(m.get("wave64"))),
                    *(p for o in _entries(m.get("ops")) if o.get("name")
                      for p in _props(f"porter:op:{o['name']}", {k: v for k, v in o.items() if k != "name"}))],
        components=[_file(e) for e in _entries(m.get("extensions")) if e.get("path")])
    parts = _torch(_dict(m.get("torch")))
    bom = Bom(serial_number=serial, components=parts,
              metadata=BomMetaData(timestamp=_dt.datetime.fromtimestamp(epoch, _dt.timezone.utc),
                                   component=wheel, tools=ToolRepository(components=_tools(m))))
    bom.register_dependency(wheel, parts)
    for part in parts:
        bom.register_dependency(part)
    return bom


def _wave64_props(w: Mapping[str, Any]) -> list[Property]:
    """A 64-lane build's warp-size-32 findings: counts per state, the override, and each finding with its state."""
    props = _props("porter:wave64", {"counts": _dict(w.get("counts")), "allowed": w.get("allowed"),
                                     "unscanned": w.get("unscanned")})
    for i, f in enumerate(_entries(w.get("findings")), 1):
        props.append(Property(name=f"porter:wave64:finding:{i}",
                              value=f"{f.get('state')}: op {f.get('op')}: {f.get('file')}:{f.get('line')}: "
                                    f"{f.get('rule')}" + (f" (by {f['by']})" if f.get("by") else "")))
    return props


def _file(entry: Mapping[str, Any]) -> Component:
    """One extension module inside the wheel, with its sha256, module, op and archs."""
    sha = entry.get("sha256")
    return Component(type=ComponentType.FILE, name=str(entry["path"]), bom_ref=f"file:{entry['path']}",
                     hashes=[HashType(alg=HashAlgorithm.SHA_256, content=str(sha))] if sha else [],
                     properties=_props("porter:extension",
                                       {k: v for k, v in entry.items() if k not in ("path", "sha256")}))


def _torch(torch: Mapping[str, Any]) -> list[Component]:
    """The torch the extension modules were built against (none for a build without torch)."""
    if not (version := str(torch.get("version") or "")):
        return []
    return [Component(type=ComponentType.LIBRARY, name="torch", version=version, bom_ref="torch",
                      purl=PackageURL(type="pypi", name="torch", version=version),
                      description="the torch the extension modules were built against and link to",
                      properties=_props("porter:torch", {k: v for k, v in torch.items() if k != "version"}))]


def _source(m: Mapping[str, Any], sources: Mapping[str, Any]) -> Component:
    """The upstream source as porter was given it: an sdist (its sha256), a git checkout (its commit), a tree."""
    project = str(m.get("component") or "unknown")
    version = str(sources.get("version") or sources.get("upstream_version") or "") or None
    sdist = sources.get("sdist_sha256")
    indexed = bool(sources.get("requirement")) or bool(re.fullmatch(r"[A-Za-z0-9._-]+==\S+",
                                                                    str(sources.get("origin") or "")))
    commit = sources.get("git_commit")
    return Component(
        type=ComponentType.LIBRARY, name=project, version=version, bom_ref="source",
        description=f"the upstream source of {project} porter built from",
        hashes=[HashType(alg=HashAlgorithm.SHA_256, content=str(sdist))] if sdist else [],
        purl=PackageURL(type="pypi", name=canonicalize_name(project), version=version) if indexed and version else None,
        pedigree=Pedigree(commits=[Commit(uid=str(commit))]) if commit else None,
        properties=_props("porter:source", {k: v for k, v in sources.items() if k != "patches"}))


def _patch(record: Mapping[str, Any]) -> Patch:
    """A patch porter applied: not upstream's (unofficial), resolving the problem it names (its ``why``)."""
    return Patch(type=PatchClassification.UNOFFICIAL,
                 resolves=[IssueType(type=IssueClassification.DEFECT, id=_patch_ref(record),
                                     name=str(record.get("id") or ""),
                                     description=str(record.get("why") or "") or None)])


def _patch_ref(record: Mapping[str, Any]) -> str:
    return f"{record.get('set') or '?'}/{record.get('id') or '?'}"


def _patch_props(record: Mapping[str, Any]) -> list[Property]:
    """What the CycloneDX patch type has no field for: the sha256 of the patch's data, where it was applied, and per
    file the sha256 before and after."""
    key = f"porter:patch:{_patch_ref(record)}"
    props = _props(key, {k: v for k, v in record.items() if k not in ("set", "id", "why", "files")})
    for f in record.get("files") or []:
        if isinstance(f, dict) and f.get("path"):
            props.append(Property(name=f"{key}:file:{f['path']}", value=f"{f.get('before') or 'none'} -> "
                                                                        f"{f.get('after') or 'none'}"))
    return props


def _tools(m: Mapping[str, Any]) -> list[Component]:
    """porter, the compiler and the toolkit (ROCm / CUDA) as the BOM's tools."""
    tc = _dict(m.get("toolchain"))
    tools = [Component(type=ComponentType.APPLICATION, name="porter", version=str(m.get("porter_version") or "")
                       or None, bom_ref="tool:porter", description="built it")]
    keys = ("name", "kind", "compiler", "compiler_version", "cxx", "hip_cxx", "toolkit_version", "cpu_isa", "cflags",
            "defines")
    if tc.get("compiler"):
        tools.append(Component(type=ComponentType.APPLICATION, name=str(tc["compiler"]), bom_ref="tool:compiler",
                               description=f"the compiler of porter's toolchain profile {tc.get('name') or '?'}",
                               properties=_props("porter:toolchain", {k: tc.get(k) for k in keys})))
    toolkit = {"rocm": "ROCm", "cuda": "CUDA"}.get(str(tc.get("kind")))
    if toolkit and tc.get("toolkit_version"):
        tools.append(Component(type=ComponentType.PLATFORM, name=toolkit, version=str(tc["toolkit_version"]),
                               bom_ref="tool:toolkit", description="the GPU toolkit the device code was compiled with"))
    return tools


# -- properties -----------------------------------------------------------------------------------

def _props(prefix: str, values: Mapping[str, Any]) -> list[Property]:
    """``prefix:key`` = value for each set value (lists comma-joined, nested mappings as ``prefix:key:sub``)."""
    out: list[Property] = []
    for key, value in values.items():
        name = f"{prefix}:{key}"
        if isinstance(value, Mapping):
            out += _props(name, value)
        elif isinstance(value, (list, tuple)):
            if value and all(isinstance(v, (str, int, float, bool)) for v in value):
                out.append(Property(name=name, value=",".join(_word(v) for v in value)))
        elif value is not None and value != "":
            out.append(Property(name=name, value=_word(value)))
    return out


def _word(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _entries(value: Any) -> list[Mapping[str, Any]]:
    return [e for e in value if isinstance(e, Mapping)] if isinstance(value, list) else []


# -- reading it back ------------------------------------------------------------------------------

def read_sbom(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The porter SBOM a wheel (``.whl``) or a net-plugin package (``.tar.gz``) carries, parsed."""
    path = Path(path)
    hint = "rebuild it with this porter version (every wheel and package it writes carries one)"
    try:
        if path.suffix == ".whl" or zipfile.is_zipfile(path):
            archive.zip_members(path)
            with zipfile.ZipFile(path) as zf:
                names = [n for n in zf.namelist() if n.count("/") == 2
                         and n.split("/")[0].endswith(".dist-info") and n.endswith(f"/{WHEEL_PATH}")]
                data = zf.read(_one(path, names, hint))
        elif path.is_file() and (path.name.endswith((".tar.gz", ".tgz", ".tar")) or tarfile.is_tarfile(path)):
            archive.members(path)
            with tarfile.open(path) as tar:
                members = {m.name: m for m in tar.getmembers() if m.isfile() and m.name.count("/") == 1
                           and m.name.endswith(f"/{NAME}")}
                f = tar.extractfile(members[_one(path, list(members), hint)])
                assert f is not None  # a regular member
                data = f.read()
        else:
            raise ConfigError(f"{path} is not a wheel or a porter package", hint="pass a .whl or a net-plugin .tar.gz")
        doc = json.loads(data)
    except (OSError, zipfile.BadZipFile, tarfile.TarError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}", hint="pass a .whl or a net-plugin .tar.gz") from None
    except archive.ENDED:
        raise archive.truncated(path, path.stat().st_size) from None
    except ValueError as exc:
        raise ConfigError(f"{path}: its SBOM is not JSON: {exc}", hint=hint) from None
    if not isinstance(doc, dict) or doc.get("bomFormat") != "CycloneDX":
        raise ConfigError(f"{path}: its {NAME} is not a CycloneDX document", hint=hint)
    return doc


def _one(path: Path, names: list[str], hint: str) -> str:
    if len(names) != 1:
        raise ConfigError(f"{path} carries no porter SBOM ({NAME})" if not names
                          else f"{path} carries {len(names)} porter SBOMs", hint=hint)
    return names[0]


def describe(doc: Mapping[str, Any]) -> list[str]:
    """The SBOM in words: what the wheel is, its source and patches, toolchain, archs, torch, and what is inside."""
    meta = _dict(doc.get("metadata"))
    wheel = _dict(meta.get("component"))
    props = _named(wheel.get("properties"))
    lines = [f"{wheel.get('name', '?')} {wheel.get('version', '')}".rstrip()
             + (f" ({wheel['purl']})" if wheel.get("purl") else "")]
    pedigree = _dict(wheel.get("pedigree"))
    for src in pedigree.get("ancestors") or []:
        sp = _named(src.get("properties"))
        ids = [f"sdist sha256 {h['content']}" for h in src.get("hashes") or [] if h.get("alg") == "SHA-256"]
        ids += [f"git commit {c['uid']}" for c in _dict(src.get("pedigree")).get("commits") or [] if c.get("uid")]
        ids += [f"tree digest {sp['porter:source:tree']}"] if "porter:source:tree" in sp else []
        origin = sp.get("porter:source:origin") or sp.get("porter:source:sdist") or sp.get("porter:source:requirement")
        lines.append(f"source: {src.get('name', '?')} {src.get('version') or '(version unknown)'}"
                     + (f" from {origin}" if origin else "") + (f"; {'; '.join(ids)}" if ids else
                                                                 "; no hash of it was recorded"))
    patches = pedigree.get("patches") or []
    if pedigree.get("notes"):
        lines.append(f"patches: unknown ({pedigree['notes']})")
    elif not patches:
        lines.append("patches: none")
    for p in patches:
        for issue in p.get("resolves") or []:
            ref = str(issue.get("id", "?"))
            key = f"porter:patch:{ref}"
            extra = ", applied to the wheel's own copy" if props.get(f"{key}:applied_to") == "wheel" else ""
            state = " (applied before porter's build, per the tree's journal)" \
                if props.get(f"{key}:state") == "applied-earlier" else ""
            lines.append(f"patch: {ref}{state}{extra}: {issue.get('description') or ''} [sha256 "
                         f"{props.get(f'{key}:sha256', '?')}]".replace(":  [", ": ["))
            lines += [f"  changes {k[len(key) + 6:]} ({v})" for k, v in props.items() if k.startswith(f"{key}:file:")]
    for tool in _dict(meta.get("tools")).get("components") or []:
        tp = _named(tool.get("properties"))
        if tool.get("bom-ref") == "tool:compiler":
            spec = tp.get("porter:toolchain:compiler_version")
            lines.append(f"toolchain: {tp.get('porter:toolchain:name', '?')} ({tp.get('porter:toolchain:kind', '?')}): "
                         f"compiler {tool.get('name')}" + (f" {spec}" if spec else "")
                         + (f", host {tp['porter:toolchain:cxx']}" if tp.get("porter:toolchain:cxx") else ""))
        elif tool.get("bom-ref") == "tool:toolkit":
            lines.append(f"toolkit: {tool.get('name')} {tool.get('version', '')}".rstrip())
        elif tool.get("bom-ref") == "tool:porter":
            lines.append(f"built by: porter {tool.get('version', '')}".rstrip())
    target = {k[len("porter:target:"):]: v for k, v in props.items() if k.startswith("porter:target:")}
    lines.append("target: " + ", ".join(f"{k} {target[k]}" for k in ("kind", "archs", "wavefront", "cpu_isa", "label")
                                        if target.get(k)))
    counts = {k[len("porter:wave64:counts:"):]: v for k, v in props.items() if k.startswith("porter:wave64:counts:")}
    if counts:
        allowed = props.get("porter:wave64:allowed")
        lines.append("wave 64: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
                     + " warp-size-32 finding(s)" + (f"; built by override (--allow-wave32 {allowed})" if allowed else ""))
        lines += [f"  {v}" for k, v in props.items() if k.startswith("porter:wave64:finding:")
                  and v.startswith("allowed")]
    torch = next((c for c in doc.get("components") or [] if c.get("bom-ref") == "torch"), None)
    if torch is not None:
        tp = _named(torch.get("properties"))
        abi = tp.get("porter:torch:cxx11_abi")
        lines.append(f"torch: {torch.get('version')} ({tp.get('porter:torch:kind', '?')}"
                     + (f", HIP {tp['porter:torch:hip']}" if tp.get("porter:torch:hip") else "")
                     + (f", CUDA {tp['porter:torch:cuda']}" if tp.get("porter:torch:cuda") else "")
                     + (f", C++11 ABI {'yes' if abi == 'true' else 'no'}" if abi else "") + ")")
    else:
        lines.append("torch: none")
    for f in wheel.get("components") or []:
        sha = next((h["content"] for h in f.get("hashes") or [] if h.get("alg") == "SHA-256"), "?")
        archs = _named(f.get("properties")).get("porter:extension:archs")
        lines.append(f"contains: {f.get('name')} sha256 {sha}" + (f" ({archs})" if archs else ""))
    return lines


def _named(props: Iterable[Mapping[str, Any]] | None) -> dict[str, str]:
    return {str(p.get("name")): str(p.get("value", "")) for p in props or [] if isinstance(p, Mapping)}
