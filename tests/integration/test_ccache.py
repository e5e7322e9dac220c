"""ccache for real: a HIP kernel through `ccache hipcc` keyed by porter's toolchain identity, remote
storage shared by two cache folders, and a rebuild of DeepSpeed's cpu_lion from the cache that gives
the same wheel bytes."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from porter.ccache import CompilerCache, identity, read_stats
from porter.run import Runner, make_env
from porter.toolchain.profile import load_toolchain
from tests.conftest import require
from tests.integration.conftest import CPU_OPS, run_porter

KERNEL = "#include <hip/hip_runtime.h>\n__global__ void k(float* x) { x[threadIdx.x] *= 2.f; }\n"


def _compile(cache: CompilerCache, src: Path, obj: Path, stats: Path) -> dict[str, int]:
    tc = load_toolchain("debian-rocm", environ={}, overrides={"archs": ("gfx90a",)})
    stats.unlink(missing_ok=True)
    env = make_env({**tc.env, **cache.env(tc, stats)})
    Runner().run([cache.program, "hipcc", "--offload-arch=gfx90a", "-c", str(src), "-o", str(obj)], env=env,
                 timeout=300)
    return read_stats(stats)


@pytest.mark.rocm
def test_hipcc_through_ccache_hits_only_for_the_same_identity(hipcc: str, tmp_path: Path) -> None:
    ccache = shutil.which("ccache")
    require("ccache", ccache is not None, "apt-get install ccache")
    assert ccache is not None
    src = tmp_path / "k.hip"
    src.write_text(KERNEL)
    obj, stats = tmp_path / "k.o", tmp_path / "stats.log"
    tc = load_toolchain("debian-rocm", environ={})
    one = CompilerCache(ccache, tmp_path / "cc", identity(tc, "HIP version: 5.2.21153"))
    assert _compile(one, src, obj, stats)["misses"] == 1
    assert _compile(one, src, obj, stats)["hits"] == 1  # the same profile hits
    other = CompilerCache(ccache, tmp_path / "cc", identity(tc, "HIP version: 5.2.99999"))
    assert _compile(other, src, obj, stats)["misses"] == 1  # another compiler version string misses
    arch = load_toolchain("debian-rocm", environ={}, overrides={"archs": ("gfx908",)})
    assert _compile(CompilerCache(ccache, tmp_path / "cc", identity(arch, "HIP version: 5.2.21153")),
                    src, obj, stats)["misses"] == 1  # another arch list misses
    # two cache folders sharing one file:// remote: what the first compiled, the second finds
    remote = f"file://{tmp_path / 'shared'}"
    a = CompilerCache(ccache, tmp_path / "node-a", one.identity, remote)
    b = CompilerCache(ccache, tmp_path / "node-b", one.identity, remote)
    assert _compile(a, src, obj, stats)["misses"] == 1
    assert _compile(b, src, obj, stats)["hits"] == 1


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory, deepspeed_sdist: Path,
         ccache_remote: dict[str, str]) -> tuple[dict[str, str], Path]:
    """A porter cache of this file's own, filled by a build of the three CPU ops (through the session's ccache
    remote, so it compiles only what no other build of the session did), and that build's wheelhouse. Not the
    session's cache: ccache keeps 5 GB in 16 folders and the emulated and ROCm builds of a worker leave objects
    of over 100 MB, so what a test counts on finding there may have been evicted."""
    require("ccache", shutil.which("ccache") is not None, "apt-get install ccache")
    folder = tmp_path_factory.mktemp("warm")
    env = {"PORTER_CACHE_DIR": str(folder / "cache")}
    res = run_porter("ops", "build", "--source", str(deepspeed_sdist), "-t", "cpu", "--ops", ",".join(CPU_OPS),
                     "-o", str(folder / "wheelhouse"), env={**env, **ccache_remote})
    assert res.returncode == 0, res.stderr[-3000:]
    return env, folder / "wheelhouse"


def test_a_rebuild_from_the_cache_gives_the_same_wheel(warm: tuple[dict[str, str], Path], deepspeed_sdist: Path,
                                                       tmp_path: Path) -> None:
    """A CPU-ops build filled the cache; with its build folder gone, every compile is a hit and the wheel is
    the same, byte for byte (times and hit counts stay in the sidecar manifest)."""
    env, wheelhouse = warm
    args = ("ops", "build", "--source", str(deepspeed_sdist), "-t", "cpu", "--ops", ",".join(CPU_OPS), "--json")
    plan = run_porter(*args, "--dry-run", "-o", str(tmp_path / "dry"), env=env)
    assert plan.returncode == 0, plan.stderr[-3000:]
    build_dir = Path(json.loads(plan.stdout)["plan"]["build_dir"])
    assert build_dir.is_dir() and "ccache" in " ".join(json.loads(plan.stdout)["plan"]["steps"][0]["argv"])
    shutil.rmtree(build_dir)  # an empty build folder: every compile asks the cache
    res = run_porter(*args, "-o", str(tmp_path), env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    cache = json.loads(res.stdout)["cache"]
    assert cache["hits"] >= len(CPU_OPS) and cache["misses"] == 0, cache
    (first,) = wheelhouse.glob("deepspeed-*.whl")
    (second,) = tmp_path.glob("deepspeed-*.whl")
    assert second.name == first.name and "+cpu.x86.64.v2-" in first.name
    assert hashlib.sha256(first.read_bytes()).digest() == hashlib.sha256(second.read_bytes()).digest()
    assert json.loads(Path(f"{second}.porter.json").read_text())["build"]["cache"]["hits"] == cache["hits"]
    uncached = run_porter(*args, "--no-cache", "--dry-run", "-o", str(tmp_path / "c"), env=env)
    assert uncached.returncode == 0 and "ccache" not in uncached.stdout


def test_the_next_release_hits_on_its_unchanged_sources(warm: tuple[dict[str, str], Path], deepspeed_sdist: Path,
                                                        tmp_path: Path) -> None:
    """Another release (another version, another folder, one other file changed) compiles its unchanged
    sources from the cache: the build folder mirrors the sources and ccache's base_dir keys them by a path
    relative to it, the same for every release."""
    import tarfile

    with tarfile.open(deepspeed_sdist) as tf:
        tf.extractall(tmp_path / "unpacked", filter="data")
    (tree,) = (tmp_path / "unpacked").iterdir()
    nxt = tree.rename(tmp_path / "deepspeed-0.19.99")
    (nxt / "version.txt").write_text("0.19.99\n")
    adam = nxt / "csrc" / "adam" / "cpu_adam.cpp"  # changed, but not cpu_lion's
    adam.write_text(adam.read_text() + "\n// changed in the next release\n")
    res = run_porter("ops", "build", "--source", str(nxt), "-t", "cpu", "--ops", "cpu_lion", "--json",
                     "-o", str(tmp_path / "wh"), env=warm[0])
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    assert "0.19.99" in doc["plan"]["build_dir"] and doc["cache"]["misses"] == 0 and doc["cache"]["hits"] == 2, \
        doc["cache"]
    assert "CCACHE_BASEDIR" in doc["plan"]["env"]
    (wheel,) = (tmp_path / "wh").glob("deepspeed-0.19.99+cpu*.whl")
