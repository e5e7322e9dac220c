"""``porter audit`` without a subprocess: the site finder on small sources, the audit of the training-tree
fixture before and after porter's patches, coverage from a target's installed DeepSpeed, the feature probes of
an installed DeepSpeed (0.18-style, at import), and the text report."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

from porter.components.jit import Target, builder_names, find_sites
from porter.install.audit import audit, render, target_of
from porter.install.env import InstalledDist, TargetEnv
from porter.patching import apply, resolve_sets

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
TRAINING = FIXTURES / "training" / "megatron-deepspeed"


LOADS = {"deepspeed": {"DeepSpeedCPUAdam": "cpu_adam", "FusedAdam": "fused_adam"}}  # as DeepSpeed declares them


def sites(src: str) -> list[tuple[str, str, str]]:
    return [(r.kind, r.when, r.key) for r in find_sites(textwrap.dedent(src), LOADS)]


def test_finder_knows_each_kind_and_when_it_runs() -> None:
    assert sites("""
        import subprocess, os
        from torch.utils import cpp_extension
        from torch.utils.cpp_extension import load_inline as li
        import torch.utils.cpp_extension as ce
        import triton
        from triton import jit
        from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam
        from deepspeed.ops.op_builder import FusedLambBuilder
        mod = cpp_extension.load(name="k_cuda", sources=["k.cu"])
        lamb = FusedLambBuilder().load()

        def f():
            li(name="inline_ext", cpp_sources="")
            ce.load("positional", ["x.cpp"])
            subprocess.run(['make', '-C', 'here'])
            os.system("make all")
            get_accelerator().create_op_builder("ShareMemCommBuilder")
            self.has_function('io_submit', ('aio', ))

        @triton.jit
        def kernel(x):
            pass

        @jit
        def other(x):
            pass
        """) == [
        ("op", "import", "op:cpu_adam"), ("op", "import", "op:fused_adam"),
        ("torch-jit", "import", "k_cuda"), ("op", "import", "builder:FusedLambBuilder"),
        ("torch-jit", "call", "inline_ext"), ("torch-jit", "call", "positional"), ("make", "call", ""),
        ("make", "call", ""), ("op", "call", "builder:ShareMemCommBuilder"), ("probe", "call", "io_submit:aio"),
        ("triton", "call", "kernel"), ("triton", "call", "other")]


def test_finder_ignores_lookalikes() -> None:
    assert sites("""
        import json, subprocess
        json.load(open("x"))
        model.load_state_dict({})
        subprocess.run(["cmake", ".."])
        def load(args):
            return None
        """) == []
    assert find_sites("def broken(:\n") == []


def test_builder_names_are_read_from_op_builder_folders(tmp_path: Path) -> None:
    (tmp_path / "op_builder").mkdir()
    (tmp_path / "op_builder" / "cpu_adam.py").write_text('class CPUAdamBuilder(Base):\n    NAME = "cpu_adam"\n')
    (tmp_path / "other.py").write_text('class NotABuilder:\n    NAME = "nope"\n')
    assert builder_names([tmp_path]) == {"CPUAdamBuilder": "cpu_adam"}


def test_training_tree_before_the_port_compiles_at_three_sites(tmp_path: Path) -> None:
    rep = audit(TRAINING, None)
    assert sorted((s.kind, s.file, s.status) for s in rep.sites) == [
        ("deepspeed", "pretrain_gpt.py", "compiles"),
        ("make", "megatron/data/dataset_utils.py", "compiles"),
        ("torch-jit", "megatron/fused_kernels/__init__.py", "compiles")]
    assert not rep.ok
    make = next(s for s in rep.sites if s.kind == "make")
    assert "dataset-helpers-prebuilt" in make.detail and s_dict_fails(make.to_dict(rep.kinds))
    text = "\n".join(render(rep))
    assert "3 site(s): 3 would compile on a compute node (3 of them fail there without a compiler)" in text


def s_dict_fails(d: dict[str, object]) -> bool:
    return d["fails_without_compiler"] is True and "make" in str(d["without_compiler"])


def ported(tmp_path: Path) -> Path:
    tree = tmp_path / "mds"
    shutil.copytree(TRAINING, tree)
    apply(tree, resolve_sets("megatron-deepspeed"))
    return tree


def target(tmp_path: Path, *, modules: dict[str, str] | None = None, ops: dict[str, bool] | None = None,
           probes: bool = False, patched: bool = False, at_import: bool = True) -> Target:
    """A target python with an installed DeepSpeed (files written here) and the given prebuilt modules."""
    site = tmp_path / "site"
    ds = site / "deepspeed"
    (ds / "ops" / "op_builder" / "cpu").mkdir(parents=True, exist_ok=True)
    info = f"installed_ops={ops or {}!r}\naccelerator_name='cpu'\n"
    (ds / "git_version_info_installed.py").write_text(info + ("porter_feature_probes={'io_submit:aio': True}\n"
                                                              if probes else ""))
    (ds / "git_version_info.py").write_text(
        "from .ops.op_builder.all_ops import ALL_OPS\n"
        + ("for op_name, builder in ALL_OPS.items():\n    op_compatible = builder.is_compatible()\n" if at_import
           else "def probe():\n    return {n: b.is_compatible() for n, b in ALL_OPS.items()}\n"))
    (ds / "ops" / "op_builder" / "builder.py").write_text(
        "class OpBuilder:\n    def has_function(self, funcname, libraries):\n        return False\n"
        + ("def _porter_recorded_probe(f, l):\n    pass\ndef _porter_refuse_jit(n):\n    pass\n" if patched else ""))
    (ds / "ops" / "op_builder" / "cpu" / "async_io.py").write_text(
        "class AsyncIOBuilder:\n    NAME = 'async_io'\n    def is_compatible(self):\n"
        "        return self.has_function('io_submit', ('aio', ))\n")
    (ds / "ops" / "op_builder" / "cpu" / "cpu_adam.py").write_text(
        "class CPUAdamBuilder:\n    NAME = 'cpu_adam'\n")
    dist = InstalledDist("deepspeed", "0.19.8+cpu", str(site), ())
    env = TargetEnv("/venv/bin/python", (3, 11, 0), "cpython", str(tmp_path), {"data": str(tmp_path)}, (), None, None,
                    {"deepspeed": dist})
    t = target_of(env)
    t.modules.update(modules or {})
    return t


def test_ported_tree_with_prebuilt_modules_compiles_nowhere(tmp_path: Path) -> None:
    tree = ported(tmp_path)
    bare = audit(tree, None)
    assert {s.kind: s.status for s in bare.sites if s.origin == "tree"} == {
        "make": "guarded", "torch-jit": "guarded", "deepspeed": "compiles"}
    helpers = "megatron_fused_kernels.helpers"
    t = target(tmp_path, modules={helpers: "megatron-fused-kernels 0.2.0+cpu.x86.64.v2"},
               ops={"cpu_adam": True, "async_io": False}, probes=True, patched=True)
    rep = audit(tree, t)
    by_kind = {s.kind: s for s in rep.sites if s.origin == "tree"}
    assert by_kind["make"].status == "covered" and by_kind["make"].module == helpers
    assert "megatron-fused-kernels 0.2.0+cpu.x86.64.v2" in by_kind["make"].detail
    assert by_kind["deepspeed"].status == "covered" and "installed_ops['cpu_adam'] is True" in by_kind["deepspeed"].detail
    assert by_kind["torch-jit"].status == "guarded"  # no GPU kernels prebuilt here: a clear error, no compile
    (probe,) = [s for s in rep.sites if s.kind == "probe"]
    assert probe.status == "covered" and probe.origin == "deepspeed 0.19.8+cpu" and probe.when == "import"
    assert rep.ok, render(rep)


def test_installed_deepspeed_probes_and_unprebuilt_ops(tmp_path: Path) -> None:
    tree = ported(tmp_path)
    t = target(tmp_path, ops={"cpu_adam": False}, at_import=False)
    rep = audit(tree, t)
    ds = next(s for s in rep.sites if s.kind == "deepspeed")
    assert ds.status == "compiles" and "does not mark cpu_adam prebuilt" in ds.detail and "--ops cpu_adam" in ds.detail
    (probe,) = [s for s in rep.sites if s.kind == "probe"]
    assert probe.status == "probe" and probe.when == "call" and "deepspeed/no-jit" in probe.detail
    assert probe.file == "deepspeed/ops/op_builder/cpu/async_io.py"
    assert not rep.ok and rep.counts()["probe"] == 1
    text = "\n".join(render(rep))
    assert "1 feature probe(s)" in text and "does not fail: answers 'absent'" in text


def test_flash_attn_without_compiled_extension_is_a_triton_site(tmp_path: Path) -> None:
    t = target(tmp_path)
    t.dists["flash-attn"] = InstalledDist("flash_attn", "2.8.3", str(tmp_path / "site"), ())
    rep = audit(tmp_path / "site" / "deepspeed" / "ops" / "op_builder" / "cpu", t)
    (fa,) = [s for s in rep.sites if s.kind == "triton"]
    assert fa.status == "compiles" and fa.origin == "flash-attn 2.8.3"


def test_installed_apex_loads_at_import_of_what_the_tree_imports(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "apex" / "op_builder").mkdir(parents=True)
    (site / "apex" / "contrib" / "xentropy").mkdir(parents=True)
    (site / "apex" / "contrib" / "unused").mkdir(parents=True)
    (site / "apex" / "__init__.py").write_text("")
    (site / "apex" / "contrib" / "__init__.py").write_text("")
    (site / "apex" / "op_builder" / "xentropy.py").write_text("class XentropyBuilder:\n    NAME = 'xentropy_cuda'\n")
    loader = "from apex.op_builder import XentropyBuilder\nxentropy_cuda = XentropyBuilder().load()\n"
    (site / "apex" / "contrib" / "xentropy" / "__init__.py").write_text(loader)
    (site / "apex" / "contrib" / "unused" / "__init__.py").write_text(loader)  # never imported by the tree
    tree = tmp_path / "train"
    tree.mkdir()
    (tree / "loss.py").write_text("from apex.contrib.xentropy import SoftmaxCrossEntropyLoss\n")
    apex = InstalledDist("apex", "1.8.0", str(site), ())
    env = TargetEnv("/venv/bin/python", (3, 11, 0), "cpython", str(tmp_path), {"data": str(tmp_path)}, (), None, None,
                    {"apex": apex})
    rep = audit(tree, target_of(env))
    (s,) = rep.sites
    assert (s.kind, s.file, s.status, s.when) == ("apex", "apex/contrib/xentropy/__init__.py", "compiles", "import")
    assert "xentropy_cuda" in s.what and "porter wheel apex" in s.detail
    shipped = InstalledDist("apex", "1.8.0", str(site),
                            (("apex/xentropy_cuda.cpython-311-x86_64-linux-gnu.so", str(site / "x.so")),))
    env = TargetEnv("/venv/bin/python", (3, 11, 0), "cpython", str(tmp_path), {"data": str(tmp_path)}, (), None, None,
                    {"apex": shipped})
    (s,) = audit(tree, target_of(env)).sites
    assert s.status == "covered" and s.module == "apex.xentropy_cuda"
