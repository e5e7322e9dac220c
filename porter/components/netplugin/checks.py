"""Whether a built network plugin fits a site: the one place build, verify and the preflight ask.

- A site whose GPUs are AMD's runs RCCL, which loads only a plugin built against the HIP runtime
  (aws-ofi-nccl ``--with-rocm``, or aws-ofi-rccl). A plugin built for CUDA or with no device runtime is
  refused there.
- A site may name the RCCL major version it runs (``[plugin] rccl_major``): a plugin built against another
  major is refused. The number is RCCL's own (``NCCL_MAJOR`` in ``rccl.h``, what ``ncclGetVersion`` and
  ``NCCL_DEBUG=INFO`` report: 2 for the RCCL 2.27.7 of ROCm 7.2), not the ROCm release it ships with.
"""

from __future__ import annotations

from porter.cluster.site.profiles import Site
from porter.toolchain.archs import parse_target


def is_rocm_site(site: Site) -> bool:
    return parse_target(site.node.arch).arch.vendor == "amd"


def site_refusals(site: Site, *, what: str, built_with_rocm: bool | None, rccl_version: str | None,
                  rocm_version: str | None = None) -> list[str]:
    """Why the plugin ``what`` cannot serve ``site`` (empty: it can, as far as these facts tell)."""
    out: list[str] = []
    if is_rocm_site(site) and built_with_rocm is False:
        out.append(f"{what}: no ROCm (the plugin does not link the HIP runtime), but site {site.name} runs "
                   f"{site.node.arch} GPUs with RCCL, which loads only a plugin built against ROCm: build it with a "
                   "ROCm toolchain (aws-ofi-nccl --with-rocm, or aws-ofi-rccl)")
    want = site.plugin.rccl_major if site.plugin is not None else 0
    if want and rccl_version:  # a plugin from a site module carries no manifest: unknown is not refused
        major = int(rccl_version.split(".")[0])
        if major != want:
            note = (f" ([plugin] rccl_major is RCCL's own major version, {major} for the RCCL of "
                    f"ROCm {rocm_version}, not the ROCm release)" if rocm_version
                    and rocm_version.split(".")[0] == str(want) else "")
            out.append(f"{what}: built against RCCL {rccl_version} (major {major}), but site {site.name} runs "
                       f"RCCL major {want}{note}: build it with the toolchain of the site's RCCL")
    return out
