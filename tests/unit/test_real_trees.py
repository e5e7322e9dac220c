"""benchmarks/real_trees.py (the real-tree gauntlet): its pure parts, without git or porter processes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "real_trees.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("real_trees", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["real_trees"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


rt = _load()

MEGATRON = """
[[target]]
id = "mds-x-compile"
repo = "someone/Megatron-DeepSpeed"
ref = "main"
command = "port-compile-only"
toolchain = "debian-rocm7"
archs = ["gfx90a", "gfx942", "gfx950"]
note = "a fork"
"""

# What porter port megatron-deepspeed --compile-only --json says per kernel (ops_prebuild.build.compile_report).
REPORT = {"version": "0.2.0", "compile_only": True, "compiled": [
    {"name": "scaled_softmax", "status": "compiled", "error": "",
     "archs": {"gfx90a": "compiled", "gfx942": "compiled", "gfx950": "compiled"}, "tus": [], "seconds": 3.0},
    {"name": "scaled_masked_softmax", "status": "failed",
     "error": "/usr/include/torch/csrc/api/include/torch/ordered_dict.h:12:7: error: redefinition of 'OrderedDict'",
     "archs": {"gfx90a": "failed", "gfx942": "failed", "gfx950": "failed"}, "tus": [], "seconds": 2.0},
    {"name": "fused_helpers", "status": "compiled", "error": "",
     "archs": {"gfx90a": "host code only", "gfx942": "host code only", "gfx950": "host code only"}, "tus": []},
]}


def test_the_shipped_targets_parse() -> None:
    targets = rt.load_targets()
    ids = [t.id for t in targets]
    assert len(ids) == len(set(ids))
    assert {t.command for t in targets} <= set(rt.COMMANDS)
    forks = {t.repo for t in targets if t.command == "port-no-kernels"}
    assert len(forks - {"microsoft/Megatron-DeepSpeed", "bigscience-workshop/Megatron-DeepSpeed"}) >= 6
    for repo in forks:  # every Megatron tree gets both commands
        assert any(t.repo == repo and t.command == "port-compile-only" for t in targets)


def test_a_target_parses() -> None:
    (t,) = rt.parse_targets(MEGATRON)
    assert (t.id, t.repo, t.ref, t.command, t.toolchain) == ("mds-x-compile", "someone/Megatron-DeepSpeed", "main",
                                                             "port-compile-only", "debian-rocm7")
    assert t.archs == ("gfx90a", "gfx942", "gfx950") and t.mirror_name == "someone+Megatron-DeepSpeed"


@pytest.mark.parametrize("text, words", [
    (MEGATRON + 'branch = "main"\n', "unknown key(s) branch"),
    (MEGATRON.replace('command = "port-compile-only"', 'command = "port-everything"'), "unknown command"),
    (MEGATRON.replace('ref = "main"\n', ""), "needs a ref"),
    (MEGATRON + 'sdist = "deepspeed==0.19.8"\n', "either repo"),
    (MEGATRON + MEGATRON, "used twice"),
    ('[[target]]\nid = "ds"\nsdist = "deepspeed==0.19.8"\ncommand = "port-no-kernels"\ntoolchain = "cpu"\n',
     "takes a tree"),
    ('[[target]]\nid = "ds"\nsdist = "deepspeed"\ncommand = "ops-compile-only"\ntoolchain = "cpu"\n',
     "project==version"),
    ('title = "x"\n' + MEGATRON, "unknown top-level key"),
    (MEGATRON.replace('archs = ["gfx90a", "gfx942", "gfx950"]', 'archs = "gfx90a"'), "list of strings"),
    (MEGATRON + 'submodules = ["csrc/composable_kernel"]\n', "submodules maps a path"),
    (MEGATRON + 'submodules = {"csrc/ck" = "composable_kernel"}\n', "submodules maps a path"),
    ('[[target]]\nid = "ds"\nsdist = "flash-attn==2.8.3"\ncommand = "fa-ck-sample"\ntoolchain = "cpu"\n'
     'submodules = {"csrc/ck" = "ROCm/composable_kernel"}\n', "submodules go with repo"),
    (MEGATRON + 'args = ["--drop-flag=-x"]\n', "port-compile-only takes no args"),
])
def test_a_bad_target_is_rejected(text: str, words: str) -> None:
    with pytest.raises(rt.TargetError, match=words.replace("(", r"\(").replace(")", r"\)")):
        rt.parse_targets(text)


def test_submodules_parse_to_sorted_path_and_repo_pairs() -> None:
    (t,) = rt.parse_targets(MEGATRON + 'submodules = {"b/y" = "o/y", "a/x" = "o/x"}\n')
    assert t.submodules == (("a/x", "o/x"), ("b/y", "o/y"))
    fa = [t for t in rt.load_targets() if t.id.startswith("fa-rocm-") and "ck-sample" in t.id]
    assert fa and all(t.submodules == (("csrc/composable_kernel", "ROCm/composable_kernel"),) for t in fa)


def test_command_mapping() -> None:
    (t,) = rt.parse_targets(MEGATRON)
    ctx = rt.context(t, src="/trees/x", work="/w/x", porter=["py", "-m", "porter"], jobs=2, python="python3")
    (name, argv), *wave64 = rt.argvs(t, ctx)
    assert name == "port"
    assert argv == ["py", "-m", "porter", "port", "megatron-deepspeed", "/trees/x", "--compile-only",
                    "-t", "debian-rocm7", "--arch", "gfx90a,gfx942,gfx950", "-j", "2", "--allow-wave32", "all",
                    "--dest", "/w/x/ported", "-o", "/w/x/wheelhouse", "--json"]
    # then the same kernels for the emulated wave-64 target, and their check: no --arch (the row's archs are GPUs)
    assert wave64 == [
        ("port-wave64", ["py", "-m", "porter", "port", "megatron-deepspeed", "/trees/x", "-t", "emulate-wave64",
                         "-j", "2", "--allow-wave32", "all", "--dest", "/w/x/ported-wave64", "-o",
                         "/w/x/wheelhouse-wave64", "--json"]),
        ("check-wave64", ["py", "-m", "porter", "emulate", "check", "/w/x/wheelhouse-wave64", "--json"])]
    assert rt.display(t, 2) == ("porter port megatron-deepspeed TREE --compile-only -t debian-rocm7 --arch "
                                "gfx90a,gfx942,gfx950 -j 2 --allow-wave32 all --dest WORK/ported -o WORK/wheelhouse "
                                "--json && porter port megatron-deepspeed TREE -t emulate-wave64 -j 2 --allow-wave32 all "
                                "--dest WORK/ported-wave64 "
                                "-o WORK/wheelhouse-wave64 --json && "
                                "porter emulate check WORK/wheelhouse-wave64 --json")
    # the report's command cell is still the ROCm compile
    assert rt.command_cell(rt.display(t, 2)) == (
        "porter port megatron-deepspeed TREE --compile-only -t debian-rocm7 --arch gfx90a,gfx942,gfx950 -j 2 "
        "--allow-wave32 all --dest WORK/ported -o WORK/wheelhouse (+2 steps)")
    # every porter step asks for JSON; a command without archs passes none
    for cmd in rt.COMMANDS.values():
        for _, tpl in cmd.steps:
            if tpl[0] == "{porter}":
                assert tpl[-1] == "--json"
    (ds,) = rt.parse_targets('[[target]]\nid = "ds"\nsdist = "deepspeed==0.19.8"\ncommand = "ops-cpu-install-verify"'
                             '\ntoolchain = "cpu"\n')
    steps = rt.argvs(ds, rt.context(ds, src=ds.sdist, work="/w", porter=["porter"], jobs=None, python="python3"))
    assert [n for n, _ in steps] == ["list", "build", "venv", "torch", "install", "verify"]
    assert [n for n, _ in rt.plan_only(steps, ["porter"])] == ["list", "build"]
    assert rt.plan_only(steps, ["porter"])[1][1][-1] == "--dry-run"
    assert steps[1][1][:4] == ["porter", "ops", "build", "--source"] and "--arch" not in steps[1][1]
    assert steps[-1][1] == ["porter", "verify", "--python", "/w/node/bin/python", "--json"]
    (dsc,) = rt.parse_targets('[[target]]\nid = "dsc"\nsdist = "deepspeed==0.19.8"\ncommand = "ops-compile-only"'
                              '\ntoolchain = "debian-rocm7"\narchs = ["gfx90a", "gfx942"]\n')
    steps = rt.argvs(dsc, rt.context(dsc, src=dsc.sdist, work="/w", porter=["porter"], jobs=4, python="python3"))
    assert [n for n, _ in steps] == ["list", "build", "build-wave64", "check-wave64"]
    assert "--arch" in steps[1][1] and "-t" in steps[1][1] and "debian-rocm7" in steps[1][1]
    assert steps[2][1] == ["porter", "ops", "build", "--source", "deepspeed==0.19.8", "-t", "emulate-wave64", "--ops",
                           "fused_adam,fused_lamb,fused_lion", "-j", "4", "-o", "/w/wheelhouse-wave64", "--json"]
    assert steps[3][1] == ["porter", "emulate", "check", "/w/wheelhouse-wave64", "--json"]
    # porter's own plan of each build (the emulated one too); the check has no plan and is left out
    assert [(n, a[-1]) for n, a in rt.plan_only(steps, ["porter"])] == [("list", "--json"), ("build", "--dry-run"),
                                                                       ("build-wave64", "--dry-run")]
    assert [c for c, cmd in rt.COMMANDS.items() if rt.has_wave64(c)] == ["port-compile-only", "ops-compile-only",
                                                                          "apex-compile-only"]
    (ax,) = rt.parse_targets('[[target]]\nid = "ax"\nrepo = "ROCm/apex"\nref = "master"\n'
                             'command = "apex-compile-only"\ntoolchain = "debian-rocm7"\n')
    steps = rt.argvs(ax, rt.context(ax, src="/t", work="/w", porter=["porter"], jobs=None, python="python3"))
    assert [n for n, _ in steps] == ["compile", "states-wave64", "build-wave64", "check-wave64"]
    assert steps[1][1][-4:] == ["--dry-run", "-o", "/w/wheelhouse", "--json"] and "--allow-wave32" in steps[1][1]
    (fa,) = rt.parse_targets('[[target]]\nid = "fa"\nsdist = "flash-attn==2.8.3"\ncommand = "fa-ck-sample"\n'
                             'toolchain = "debian-rocm7"\nargs = ["--drop-flag=-amdgpu-early-inline-all"]\n')
    assert rt.display(fa) == ("porter wheel flash-attn --source flash-attn==2.8.3 --backend ck --compile-only "
                              "--sample cover -t debian-rocm7 --drop-flag=-amdgpu-early-inline-all "
                              "--allow-wave32 all -o WORK/wheelhouse --json")


def test_per_arch_summary_from_a_compile_report() -> None:
    ops = rt.collect_ops([REPORT])
    assert [(o["name"], o["status"]) for o in ops] == [("scaled_softmax", "compiled"),
                                                        ("scaled_masked_softmax", "failed"),
                                                        ("fused_helpers", "host-only")]
    assert rt.arch_summary(ops, ("gfx90a", "gfx942", "gfx950")) == \
        "gfx90a 1/2, gfx942 1/2, gfx950 1/2, +1 host-only"
    assert rt.op_counts(ops) == (2, 3, 0, 0)
    # porter's report says "host-only" per arch now (apex's 1.8.0 and 1.9.0 rows read "23/27" for 4 host-only ops)
    now = dict(REPORT, compiled=[dict(r, archs={a: "host-only" for a in r["archs"]}) if r["name"] == "fused_helpers"
                                 else r for r in REPORT["compiled"]])
    assert rt.arch_summary(rt.collect_ops([now]), ("gfx90a", "gfx942", "gfx950")) == \
        "gfx90a 1/2, gfx942 1/2, gfx950 1/2, +1 host-only"


def test_excluded_ops_come_from_the_op_list() -> None:
    listed = {"ops": [{"name": "evoformer_attn", "compatible": False, "reason": "Unable to  locate CUTLASS"},
                      {"name": "fused_adam", "compatible": True, "reason": ""}]}
    built = {"compiled": [{"name": "fused_adam", "status": "compiled", "archs": {"gfx90a": "compiled"}}]}
    ops = rt.collect_ops([listed, built])
    assert ops[0] == {"name": "evoformer_attn", "status": "excluded", "reason": "Unable to locate CUTLASS"}
    assert rt.op_counts(ops) == (1, 1, 1, 0)


def test_ops_the_planner_left_out_come_from_its_notes() -> None:
    doc = {"notes": ["regime 'env' detected from the tree (apex 1.14.0a0)",
                     "nccl_p2p_cuda: not read from nccl_p2p.py:NCCLP2PBuilder (left out): self.generator_args()",
                     "focal_loss: not planned: no sources"],
           "compiled": [{"name": "amp_C", "status": "compiled", "archs": {"gfx90a": "compiled"}}]}
    ops = rt.collect_ops([doc])
    assert [(o["name"], o["status"]) for o in ops] == [("nccl_p2p_cuda", "left-out"), ("focal_loss", "left-out"),
                                                        ("amp_C", "compiled")]
    assert ops[0]["reason"] == "self.generator_args()"
    assert rt.op_counts(ops) == (1, 1, 0, 2)


def _step(**kw: object) -> object:
    return rt.Step(**{"name": "port", "exit_code": 0, "seconds": 1.5, "stdout": "{}", "stderr": "", **kw})


def test_a_traceback_is_a_failure_even_with_exit_0() -> None:
    (t,) = rt.parse_targets(MEGATRON)
    err = ("==> hipifying\nTraceback (most recent call last):\n  File \"x.py\", line 3, in <module>\n"
           "    open(p)\nFileNotFoundError: [Errno 2] No such file: '/tmp/porter-hipify-1/a.cpp'\n")
    row = rt.make_row(t, [_step(stderr=err)], started=0.0, source={"repo": t.repo, "ref": "main"})
    assert row["result"] == "failed" and row["traceback"] is True and row["exit_code"] == 0
    assert row["first_error"] == "Traceback: FileNotFoundError: [Errno 2] No such file: 'TMP/a.cpp'"
    ok = rt.make_row(t, [_step(stdout='{"version": "0.2.0", "patches": [{"patch": "p", "state": "applied"}]}')],
                     started=0.0, source={"repo": t.repo, "ref": "main"})
    assert ok["result"] == "ok" and ok["first_error"] == "" and ok["source"]["version"] == "0.2.0"
    assert ok["detail"] == "patches 1 applied"


def test_a_failed_op_makes_the_row_fail_with_its_error() -> None:
    (t,) = rt.parse_targets(MEGATRON)
    import json
    row = rt.make_row(t, [_step(exit_code=3, stdout=json.dumps(REPORT), stderr="ERROR: 1 op(s) failed\n")],
                      started=0.0, source={})
    assert row["result"] == "failed" and row["exit_code"] == 3
    assert row["first_error"] == "1 op(s) failed"
    row = rt.make_row(t, [_step(exit_code=0, stdout=json.dumps(REPORT))], started=0.0, source={})
    assert row["result"] == "failed"
    assert row["first_error"].startswith("scaled_masked_softmax: ") and "redefinition of 'OrderedDict'" in \
        row["first_error"]


def test_merge_keeps_old_rows() -> None:
    old = {"a": {"id": "a", "result": "ok", "date": "2026-11-01"},
           "b": {"id": "b", "result": "failed", "date": "2026-11-01"},
           "c": {"id": "c", "result": "ok", "date": "2026-11-01"}}
    new = [{"id": "b", "result": "ok", "date": "2026-11-25"}, {"id": "d", "result": "failed", "date": "2026-11-25"},
           {"id": "c", "result": "skipped", "reason": "no mirror", "date": "2026-11-25"}]
    merged = rt.merge_rows(old, new)
    assert merged["a"] == old["a"]  # not run now: kept
    assert merged["b"]["result"] == "ok" and merged["d"]["result"] == "failed"
    assert merged["c"] == old["c"]  # only skipped now: the earlier real result stays
    assert rt.merge_rows({}, new[2:])["c"]["result"] == "skipped"


def test_a_target_stopped_by_sigterm_is_not_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Session 7: SIGTERM mid-row stopped the step, and the gauntlet recorded the stopped step as a failed row over
    the earlier good one. A target SIGTERM stopped is not recorded; one that finished is."""
    (target,) = rt.parse_targets(MEGATRON)
    results, report = tmp_path / "rows.json", tmp_path / "report.md"
    runner = rt.Runner(targets=[target], mirrors=None, work=tmp_path, porter=["porter"], env={}, jobs=1,
                       timeout=60, results=results, report=report, porter_rev="abc")
    row = {"id": target.id, "result": "failed", "date": "2026-11-26", "seconds": 1.0}
    monkeypatch.setattr(runner, "run_target", lambda t: (rt._STOPPING.set(), dict(row))[1])
    monkeypatch.setattr(rt, "_STOPPING", rt.threading.Event())
    assert runner.run_and_record(target) is None and not results.exists() and not report.exists()
    monkeypatch.setattr(rt, "_STOPPING", rt.threading.Event())
    monkeypatch.setattr(runner, "run_target", lambda t: dict(row))
    assert runner.run_and_record(target) == row and target.id in results.read_text()


def test_after_sigterm_no_queued_target_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Session 9: SIGTERM stopped the running target, but the targets queued behind it then ran one after another
    (the thread pool's exit waits for its queue). After SIGTERM nothing starts any more."""
    import dataclasses

    (target,) = rt.parse_targets(MEGATRON)
    targets = [dataclasses.replace(target, id=f"t{i}") for i in range(3)]
    runner = rt.Runner(targets=targets, mirrors=None, work=tmp_path, porter=["porter"], env={}, jobs=1,
                       timeout=60, results=tmp_path / "rows.json", report=tmp_path / "report.md", porter_rev="abc")
    ran: list[str] = []

    def stopped(t: rt.Target) -> dict[str, object]:
        ran.append(t.id)
        rt._STOPPING.set()  # SIGTERM arrives while the first target runs
        return {"id": t.id, "result": "failed", "seconds": 1.0}

    monkeypatch.setattr(rt, "_STOPPING", rt.threading.Event())
    monkeypatch.setattr(runner, "run_target", stopped)
    assert rt.run_targets(runner, targets, 1) == 0
    assert ran == ["t0"] and not (tmp_path / "rows.json").exists()


def test_select_only_skip_done_rerun_failed() -> None:
    targets = rt.parse_targets(MEGATRON + MEGATRON.replace("mds-x-compile", "mds-y-compile")
                               + MEGATRON.replace("mds-x-compile", "apex-master"))
    rows = {"mds-x-compile": {"result": "ok"}, "mds-y-compile": {"result": "failed"}}
    assert [t.id for t in rt.select(targets, rows, ["mds-*"], False, False)] == ["mds-x-compile", "mds-y-compile"]
    assert [t.id for t in rt.select(targets, rows, [], True, False)] == ["apex-master"]
    assert [t.id for t in rt.select(targets, rows, [], False, True)] == ["mds-y-compile"]


def test_table_rendering_from_a_row() -> None:
    (t,) = rt.parse_targets(MEGATRON)
    import json
    row = rt.make_row(t, [_step(exit_code=3, stdout=json.dumps(REPORT), seconds=125.0)], started=1764000000.0,
                      source={"repo": t.repo, "ref": "main", "commit": "f4157bea69f3df8c6cb66f2ebcda66ba03d1288e",
                              "commit_date": "2024-12-24"}, generation="2023+", porter_rev="abc1234")
    line = rt.table_row(row)
    cells = [c.strip() for c in line.strip("|").split(" | ")]
    assert cells[0] == "`mds-x-compile`"
    assert cells[1] == "someone/Megatron-DeepSpeed@main `f4157bea6` (2024-12-24), 2023+ kernels"
    assert cells[2].startswith("`porter port megatron-deepspeed TREE --compile-only") and "--json" not in cells[2]
    assert cells[3] == "✗"
    assert cells[4] == "gfx90a 1/2, gfx942 1/2, gfx950 1/2, +1 host-only"
    assert cells[5] == "2/3" and cells[6] == "—" and cells[7] == "2 min 05 s" and cells[8] == "2025-11-24 (abc1234)"
    assert row["wave64"] is None  # the port failed: its wave-64 steps did not run
    assert "redefinition of 'OrderedDict'" in cells[9]
    text = rt.render({row["id"]: row}, [t])
    assert line in text and "## The trees" in text
    assert "| target | tree | command | result | per arch | ops | checked at wave 64 | wall | date (porter) | " \
           "first error |\n|---|---|---|---|---|---|---|---|---|---|\n" in text
    assert "1 targets: 1 ✗." in text
    skipped = rt.skipped_row(t, "no clone of someone/Megatron-DeepSpeed under the mirrors", started=0.0)
    assert "| skipped |" in rt.table_row(skipped) and "no clone of" in rt.table_row(skipped)


def test_scrub_takes_out_machine_paths_and_hosts() -> None:
    scrub = rt.Scrub([("/home/me/gauntlet/t1/tree", "TREE"), ("/home/me/gauntlet/t1", "WORK")])
    assert scrub("/home/me/gauntlet/t1/tree/megatron/x.cu:3: error") == "TREE/megatron/x.cu:3: error"
    assert scrub("fetch https://files.example.org/a.tar.gz failed") == "fetch <url> failed"
    assert scrub("/var/lib/porter/sid-rocm7/usr/include/x.h") == "ROOT/usr/include/x.h"
    assert scrub("/opt/v/lib/python3.11/site-packages/torch/x.py") == "SITE/torch/x.py"


# What porter emulate check --json prints: one row per check (porter.emulate.checks).
def _check(kernel: str, check: str, err: float | None, tol: float | None = 2e-3, **kw: object) -> dict[str, object]:
    ok = err is not None and tol is not None and err <= tol
    return {"kernel": kernel, "check": check, "wave": 64, "max_abs_err": err, "tolerance": tol, "ok": ok, **kw}


SOFTMAX_OK = [_check(f"megatron.{k}", f"fwd+bwd fp16 sq=16 sk={n}", 4.9e-4) for k in
              ("scaled_upper_triang_masked_softmax", "scaled_masked_softmax") for n in (32, 128)]
LAYER_NORM_BAD = [_check("megatron.layer_norm", "fwd+bwd (input, weight, bias grads) float32 48x256", 0.41, 1e-3),
                  _check("megatron.layer_norm", "fwd+bwd (input, weight, bias grads) float16 48x256", 0.52, 2e-3)]

# porter port -t emulate-wave64 --json: patches, hipified files and notes as the ROCm port says them, and "built"
PORT_WAVE64 = {"version": "0.2.0", "patches": [{"patch": "p", "state": "applied"}], "hipified": ["a.hip"],
               "notes": ["a note of the emulated port"], "built": [{"name": "scaled_softmax_cuda", "status": "built"}],
               "wheel": "/w/wheelhouse-wave64/megatron_kernels-0.2.0+emu.wave64-cp311-cp311-linux_x86_64.whl"}
COMPILED = {"version": "0.2.0", "compile_only": True, "patches": [{"patch": "p", "state": "applied"}],
            "compiled": [dict(REPORT["compiled"][0])]}


def _wave64_steps(check: dict[str, object]) -> list[object]:
    import json
    return [_step(stdout=json.dumps(COMPILED)), _step(name="port-wave64", stdout=json.dumps(PORT_WAVE64)),
            _step(name="check-wave64", **check)]


def test_a_passed_check_at_wave_64() -> None:
    import json
    (t,) = rt.parse_targets(MEGATRON)
    row = rt.make_row(t, _wave64_steps({"stdout": json.dumps(SOFTMAX_OK)}), started=0.0, source={})
    assert row["result"] == "ok" and row["first_error"] == ""
    w = row["wave64"]
    assert (w["built"], w["checked"], w["passed"], w["exit_code"]) == (2, 2, 2, 0)
    fam = w["families"]["megatron.scaled_masked_softmax"]
    assert fam == {"ok": True, "checks": 2, "failed": 0, "check": "fwd+bwd fp16 sq=16 sk=32", "max_abs_err": 4.9e-4,
                   "tolerance": 2e-3}
    # the emulated port's document is not the ROCm compile's: ops, patches, notes and detail come from the latter
    assert [(o["name"], o["status"]) for o in row["ops"]] == [("scaled_softmax", "compiled")]
    assert row["patches"] == [{"patch": "p", "state": "applied"}] and row["porter_notes"] == []
    assert row["detail"] == "patches 1 applied" and row["arch_summary"] == "gfx90a 1/1, gfx942 1/1, gfx950 1/1"
    assert rt.wave64_cell(row) == "2/2"
    cells = [c.strip() for c in rt.table_row(row).strip("|").split(" | ")]
    assert cells[3] == "✓" and cells[6] == "2/2"


def test_the_wave_64_cell_counts_the_rocm_builds_finding_states() -> None:
    """A compile row builds every kernel (--allow-wave32 all): its cell says what each warp-size-32 finding is."""
    import json
    (t,) = rt.parse_targets(MEGATRON)
    compiled = {**COMPILED, "wave64": {"counts": {"fixed": 6, "allowed": 2}, "allowed": ["all"], "findings": []}}
    steps = [_step(stdout=json.dumps(compiled)), _step(name="port-wave64", stdout=json.dumps(
        {**PORT_WAVE64, "wave64": {"counts": {"fixed": 99}}})), _step(name="check-wave64", stdout=json.dumps(SOFTMAX_OK))]
    row = rt.make_row(t, steps, started=0.0, source={})
    assert row["wave64_states"] == {"allowed": 2, "fixed": 6}  # the ROCm build's, not the emulated one's
    assert rt.wave64_cell(row) == "2/2; findings: 2 allowed, 6 fixed"


def test_wave64_only_keeps_the_rocm_row_and_dates_its_own_check() -> None:
    import json
    (t,) = rt.parse_targets(MEGATRON)
    earlier = rt.make_row(t, [_step(stdout=json.dumps(COMPILED))], started=0.0, source={}, porter_rev="aaa")
    assert earlier["result"] == "ok" and earlier["wave64"] is None
    steps = [_step(name="port-wave64", stdout=json.dumps(PORT_WAVE64)),
             _step(name="check-wave64", stdout=json.dumps(SOFTMAX_OK))]
    row = rt.with_wave64(earlier, t, steps, started=86400.0 * 3, source={"commit": "c0ffee"}, porter_rev="bbb")
    assert row["result"] == "ok" and row["porter"] == "aaa" and row["ops"] == earlier["ops"]
    assert (row["wave64"]["passed"], row["wave64"]["porter"], row["wave64"]["commit"]) == (2, "bbb", "c0ffee")
    assert rt.wave64_cell(row) == "2/2 (checked 1970-01-04, porter bbb)"
    bad = [_step(name="port-wave64", stdout=json.dumps(PORT_WAVE64)),
           _step(name="check-wave64", stdout=json.dumps(SOFTMAX_OK + LAYER_NORM_BAD), exit_code=1)]
    row = rt.with_wave64(earlier, t, bad, started=0.0, source={}, porter_rev="aaa")
    assert row["result"] == "failed" and rt.wave64_cell(row).startswith("2/3 (layer_norm ✗)")
    broken = rt.with_wave64(earlier, t, [_step(name="port-wave64", exit_code=1)], started=0.0, source={})
    assert broken["result"] == "failed" and broken["wave64"]["error"] == "port-wave64 exited 1"
    # a row that failed only in its wave-64 build becomes ok when the rerun passes; one that failed elsewhere not
    mended = rt.with_wave64({**broken, "steps": [{"name": "port", "exit_code": 0}, {"name": "port-wave64",
                                                                                   "exit_code": 1}],
                             "first_error": "port-wave64: command failed with exit code 1"}, t, steps, started=0.0,
                            source={})
    assert mended["result"] == "ok" and mended["first_error"] == "" and not mended["traceback"]
    still = rt.with_wave64({**broken, "steps": [{"name": "port", "exit_code": 1}], "first_error": "port: x"}, t, steps,
                           started=0.0, source={})
    assert still["result"] == "failed"
    # a dry run of the ROCm build among the steps (apex's states-wave64) gives the row its findings' states
    plan = {"dry_run": True, "wave64": {"counts": {"fixed": 16, "safe": 12, "allowed": 34}}}
    counted = rt.with_wave64(earlier, t, [_step(name="states-wave64", stdout=json.dumps(plan)), *steps], started=0.0,
                             source={})
    assert counted["wave64_states"] == {"allowed": 34, "fixed": 16, "safe": 12}
    assert rt.wave64_cell(counted) == "2/2; findings: 34 allowed, 16 fixed, 12 safe (checked 1970-01-01, porter ?)"


def test_a_failed_check_at_wave_64_fails_the_row_with_its_first_failure() -> None:
    import json
    (t,) = rt.parse_targets(MEGATRON)
    rows = SOFTMAX_OK + LAYER_NORM_BAD
    err = "ERROR: 1 kernel family failed: megatron.layer_norm (wave 64)\n  hint: a kernel wrong at wave 64 ...\n"
    row = rt.make_row(t, _wave64_steps({"exit_code": 1, "stdout": json.dumps(rows), "stderr": err}), started=0.0,
                      source={})
    assert row["result"] == "failed" and row["exit_code"] == 1 and row["traceback"] is False
    # the check's first failure, not porter's ERROR line (which names the family alone)
    assert row["first_error"] == ("check-wave64: megatron.layer_norm: fwd+bwd (input, weight, bias grads) float32 "
                                  "48x256: max err 4.10e-01 > tolerance 1.0e-03 (wave 64)")
    w = row["wave64"]
    assert (w["built"], w["checked"], w["passed"]) == (3, 3, 2)
    bad = w["families"]["megatron.layer_norm"]
    # its worst check: the largest error against its tolerance (0.41 / 1e-3 > 0.52 / 2e-3)
    assert (bad["ok"], bad["checks"], bad["failed"], bad["max_abs_err"], bad["tolerance"]) == (False, 2, 2, 0.41, 1e-3)
    assert rt.wave64_cell(row) == "2/3 (layer_norm ✗)"
    cells = [c.strip() for c in rt.table_row(row).strip("|").split(" | ")]
    assert cells[3] == "✗" and cells[6] == "2/3 (layer_norm ✗)" and cells[9].startswith("check-wave64: megatron.")


def test_a_kernel_that_raised_is_built_but_not_checked() -> None:
    import json
    (t,) = rt.parse_targets(MEGATRON)
    raised = [_check("megatron.scaled_softmax", "fwd+bwd fp16 sq=16 sk=32", None,
                     error="RuntimeError: __shfl_down at /tmp/porter-emulate-64-x/scaled_softmax_cuda.hip:57 reached "
                           "by lanes 1,3 of wavefront 0 but not by lanes 0,2: a divergent wave operation is not "
                           "modelled")]
    row = rt.make_row(t, _wave64_steps({"exit_code": 1, "stdout": json.dumps(SOFTMAX_OK + raised)}), started=0.0,
                      source={}, scrub=rt.Scrub())
    w = row["wave64"]
    assert (w["built"], w["checked"], w["passed"]) == (3, 2, 2)
    fam = w["families"]["megatron.scaled_softmax"]
    assert fam["ok"] is False and fam["max_abs_err"] is None
    assert fam["error"].startswith("RuntimeError: __shfl_down at TMP/")
    assert row["first_error"].startswith("check-wave64: megatron.scaled_softmax: fwd+bwd fp16 sq=16 sk=32: "
                                         "RuntimeError: __shfl_down at TMP/scaled_softmax_cuda.hip:57")
    assert rt.wave64_cell(row) == "2/3 (scaled_softmax ✗)"
    # NaN is an error too, kept as text (JSON has no NaN)
    nan = [_check("deepspeed.fused_adam", "multi_tensor_adam (AdamW) vs torch", float("nan"), 1e-5)]
    w = rt.wave64_result(_step(name="check-wave64", exit_code=1, stdout=json.dumps(nan)))
    assert w["families"]["deepspeed.fused_adam"]["max_abs_err"] == "nan" and w["passed"] == 0
    assert json.loads(json.dumps(w, allow_nan=False)) == w


def test_nothing_to_check_at_wave_64_is_0_of_0_and_not_a_failure() -> None:
    (t,) = rt.parse_targets(MEGATRON)
    err = ("ERROR: the emulated wheels in /home/me/w/mds-x-compile/wheelhouse-wave64 hold no kernel porter checks\n"
           "  hint: build the Megatron kernels (porter port) or DeepSpeed's fused optimizers\n")
    scrub = rt.Scrub([("/home/me/w/mds-x-compile", "WORK")])
    row = rt.make_row(t, _wave64_steps({"exit_code": 4, "stdout": "", "stderr": err}), started=0.0, source={},
                      scrub=scrub)
    assert row["result"] == "ok" and row["first_error"] == "" and row["exit_code"] == 4
    w = row["wave64"]
    assert (w["built"], w["checked"], w["passed"], w["families"]) == (0, 0, 0, {})
    assert w["note"] == "the emulated wheels in WORK/wheelhouse-wave64 hold no kernel porter checks"
    assert rt.wave64_cell(row) == "0/0"
    assert not _step(name="check-wave64", exit_code=4, stdout="").failed
    assert _step(name="port", exit_code=4, stdout="").failed  # exit 4 is "nothing to check" for the check alone


def test_a_check_that_gave_no_rows_fails_the_row() -> None:
    (t,) = rt.parse_targets(MEGATRON)
    err = "ERROR: wheelhouse not found: /w/wheelhouse-wave64\n"
    row = rt.make_row(t, _wave64_steps({"exit_code": 2, "stdout": "", "stderr": err}), started=0.0, source={})
    assert row["result"] == "failed"
    assert row["first_error"] == "check-wave64: wheelhouse not found: /w/wheelhouse-wave64"
    assert row["wave64"]["error"] == "check exited 2, no rows"
    assert rt.wave64_cell(row) == "✗ (check exited 2, no rows)"
    row = rt.make_row(t, _wave64_steps({"exit_code": None, "stdout": "", "timed_out": True, "seconds": 900.0}),
                      started=0.0, source={})
    assert row["first_error"] == "check-wave64: timed out after 900 s"
    assert rt.wave64_cell(row) == "✗ (check timed out)"


def test_the_wave_64_column_of_other_commands_and_older_rows() -> None:
    import json
    port_text = MEGATRON.replace("mds-x-compile", "mds-x-port").replace('command = "port-compile-only"',
                                                                        'command = "port-no-kernels"')
    targets = rt.parse_targets(MEGATRON + port_text + MEGATRON.replace("mds-x-compile", "mds-x-new"))
    compile_t, port_t, new_t = targets
    port = rt.make_row(port_t, [_step(stdout=json.dumps({"patches": []}))], started=0.0, source={})
    assert "wave64" not in port and rt.wave64_cell(port) == "—"
    # a row an older run wrote: no wave64 field; it renders as before, with "—" in the new column
    old = {"id": "mds-x-compile", "command": "port-compile-only", "argv": rt.display(compile_t).split(" && ")[0],
           "source": {"repo": compile_t.repo, "ref": "main"}, "result": "ok", "arch_summary": "gfx90a 3/3",
           "ops_done": 3, "ops_total": 3, "seconds": 168.0, "date": "2026-11-27T10:00Z", "porter": "c6202c5"}
    cells = [c.strip() for c in rt.table_row(old).strip("|").split(" | ")]
    assert cells[3:] == ["✓", "gfx90a 3/3", "3/3", "—", "2 min 48 s", "2026-11-27 (c6202c5)", ""]
    assert cells[2] == ("`porter port megatron-deepspeed TREE --compile-only -t debian-rocm7 --arch "
                        "gfx90a,gfx942,gfx950 --allow-wave32 all --dest WORK/ported -o WORK/wheelhouse`")
    text = rt.render({"mds-x-compile": old, "mds-x-port": port}, targets)
    lines = [ln for ln in text.splitlines() if ln.startswith("| `")]
    assert len(lines) == 3 and all(ln.count(" | ") == 9 for ln in lines)  # ten cells, the not-run row's too
    assert lines[2].startswith("| `mds-x-new` |") and "| not run | — | — | — | — | — |" in lines[2]
    intro = " ".join(text.split("## Results")[0].split())
    assert "every kernel checked at wave 64 passed" in intro and "[emulate.md](emulate.md)" in intro
    assert "`0/0`: the tree has no kernel porter checks" in intro and "`2/3 (layer_norm ✗)`" in intro


def test_deepspeed_fused_optimizers_at_wave_64() -> None:
    """The emulated build's op list ("ops": built) is not the ROCm compile's: the row's ops and counts stay those of
    the compile report and the op list."""
    import json
    (t,) = rt.parse_targets('[[target]]\nid = "ds"\nsdist = "deepspeed==0.19.8"\ncommand = "ops-compile-only"'
                            '\ntoolchain = "debian-rocm7"\narchs = ["gfx90a"]\n')
    listed = {"source": {"project": "deepspeed", "version": "0.19.8"},
              "ops": [{"name": "fused_adam", "compatible": True}, {"name": "gds", "compatible": False,
                                                                     "reason": "gds is not compatible with ROCM"}]}
    compiled = {"compile_only": True, "ops": [], "compiled": [
        {"name": "fused_adam", "status": "compiled", "archs": {"gfx90a": "compiled"}}]}
    emulated = {"ops": [{"name": n, "status": "built", "error": ""}
                        for n in ("fused_adam", "fused_lamb", "fused_lion")], "excluded": [],
                "wheel": "/w/wheelhouse-wave64/deepspeed-0.19.8+emu.wave64-cp311-cp311-linux_x86_64.whl"}
    rows = [_check(f"deepspeed.{n}", f"{n} vs torch, fp32, 10 steps", 1e-7, 1e-5)
            for n in ("fused_adam", "fused_lamb", "fused_lion")]
    steps = [_step(name="list", stdout=json.dumps(listed)), _step(name="build", stdout=json.dumps(compiled)),
             _step(name="build-wave64", stdout=json.dumps(emulated)),
             _step(name="check-wave64", stdout=json.dumps(rows))]
    row = rt.make_row(t, steps, started=0.0, source={"sdist": t.sdist})
    assert row["result"] == "ok" and row["source"]["version"] == "0.19.8"
    assert [(o["name"], o["status"]) for o in row["ops"]] == [("gds", "excluded"), ("fused_adam", "compiled")]
    assert (row["ops_done"], row["ops_total"], row["ops_excluded"]) == (1, 1, 1) and row["detail"] == ""
    assert rt.wave64_cell(row) == "3/3" and sorted(row["wave64"]["families"]) == [
        "deepspeed.fused_adam", "deepspeed.fused_lamb", "deepspeed.fused_lion"]
    # the emulated build failed: the check did not run, the row fails with the build's error
    steps[2] = _step(name="build-wave64", exit_code=3, stdout=json.dumps(emulated),
                     stderr="ERROR: 1 op(s) failed: fused_lion\n")
    row = rt.make_row(t, steps[:3], started=0.0, source={"sdist": t.sdist})
    assert row["result"] == "failed" and row["first_error"] == "build-wave64: 1 op(s) failed: fused_lion"
    assert row["wave64"] is None and rt.wave64_cell(row) == "—"
