"""porter matrix: the file -> cells, validation, job scripts, Slurm argv, cells, report (no subprocess:
a fake runner plays sbatch, scontrol, squeue and the builds)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from porter.cli import cli
from porter.cluster.slurm import sbatch as sl
from porter.cluster.slurm.sbatch import SUBMISSION, JobFolder
from porter.cluster.slurm.matrix_run import (PLAN, REPORT, finish, outcome, read_plan, run_cell, run_local,
                                             run_matrix, status, write_plan)
from porter.cluster.slurm.matrix import Matrix, load_matrix
from porter.errors import CheckFailed, CommandFailed, ConfigError, PartialSuccess, ToolError
from porter.run import Result, Runner
from tests.fixtures.install.wheels import make_manifest, make_wheel

ROOT = Path(__file__).resolve().parents[2]
APEX_ENV = ROOT / "tests" / "fixtures" / "apex-env"


@dataclass
class FakeRunner(Runner):
    """Answers by program name (a function of argv); records every command and its env."""

    answers: dict[str, Callable[[list[str]], tuple[int, str]]] = field(default_factory=dict)
    ran: list[list[str]] = field(default_factory=list)
    envs: list[dict[str, str]] = field(default_factory=list)

    def run(self, argv: Sequence[str | os.PathLike[str]], *, env: Mapping[str, str] | None = None,
            cwd: str | os.PathLike[str] | None = None, timeout: float | None = None, check: bool = True,
            hint: str | None = None, input: str | None = None) -> Result:
        args = [os.fspath(a) for a in argv]
        self.ran.append(args)
        self.envs.append(dict(env or {}))
        answer = self.answers.get(Path(args[0]).name)
        code, out = answer(args) if answer else (0, "")
        if check and code:
            raise CommandFailed(args, code, out)
        return Result(args, code, out, 0.0)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A matrix file beside a cpu-v3 profile and a copy of the apex fixture."""
    shutil.copytree(APEX_ENV, tmp_path / "src" / "apex-env")
    write(tmp_path / "profiles" / "cpu-v3.toml", 'extends = "cpu"\ncpu_isa = "x86-64-v3"\n')
    write(tmp_path / "m.toml", """\
name = "t"
toolchains = ["cpu", "profiles/cpu-v3.toml"]

[[component]]
name = "apex"
sources = ["src/apex-env"]

[[component]]
name = "deepspeed"
versions = ["0.19.8"]
ops = ["cpu_adam", "cpu_lion"]
toolchains = ["cpu"]

[slurm]
partition = "batch"
cpus_per_task = 2
max_parallel = 2
""")
    return tmp_path


def sbin(tmp_path: Path, *names: str) -> dict[str, str]:
    """An env whose PATH holds stand-ins for Slurm's commands (which() only checks the exec bit)."""
    d = tmp_path / "sbin"
    d.mkdir(exist_ok=True)
    for n in names:
        write(d / n, "#!/bin/sh\n").chmod(0o755)
    return {"PATH": str(d), "HOME": str(tmp_path)}


# ------------------------------------------------------------------------------------------ the file

def test_cells_are_toolchains_times_sources_and_versions(project: Path) -> None:
    m = load_matrix(project / "m.toml", directory=project / "d", environ={})
    assert [c.id for c in m.cells] == ["apex-apex-env-cpu", "apex-apex-env-cpu-v3", "deepspeed-0.19.8-cpu"]
    apex, apex3, ds = m.cells
    assert apex.request().to_dict() == {"schema": "porter.request/1", "component": "apex", "args": [], "last": {},
                                        "options": {"source": str(project / "src" / "apex-env"), "toolchain_ref": "cpu"}}
    assert apex3.toolchain == str(project / "profiles" / "cpu-v3.toml") and apex3.label == "cpu.x86.64.v3"
    assert ds.request().options == {"source": "deepspeed==0.19.8", "toolchain_ref": "cpu",
                                    "ops": ["cpu_adam", "cpu_lion"]}
    assert m.wheelhouse == project / "d" / "wheelhouse" and m.slurm.partition == "batch"


def test_python_jobs_and_args_reach_every_cell(project: Path) -> None:
    text = (project / "m.toml").read_text().replace('name = "t"', 'name = "t"\npython = "/opt/py/bin/python"\njobs = 3')
    text = text.replace('ops = ["cpu_adam", "cpu_lion"]', 'ops = ["cpu_adam"]\nargs = ["--with-deps"]')
    write(project / "m.toml", text)
    ds = load_matrix(project / "m.toml", directory=project / "d", environ={}).cells[-1]
    req = ds.request()
    assert (req.options["python"], req.options["jobs"], req.args) == ("/opt/py/bin/python", 3, ("--with-deps",))


def test_every_problem_is_reported_at_once_naming_the_cells(project: Path) -> None:
    write(project / "bad.toml", """\
toolchains = ["cpu", "no-such-preset"]
[[component]]
name = "apex"
sources = ["src/apex-env", "src/missing"]
[[component]]
name = "apexx"
sources = ["src/apex-env"]
toolchains = ["cpu"]
""")
    with pytest.raises(ConfigError) as err:
        load_matrix(project / "bad.toml", directory=project / "d", environ={})
    msg = err.value.message
    assert err.value.exit_code == 2 and "nothing was submitted" in msg
    assert "cell apex-apex-env-no-such-preset, apex-missing-no-such-preset: toolchain 'no-such-preset'" in msg
    assert "cell apexx-apex-env-cpu: no component named 'apexx'; did you mean apex?" in msg
    assert "cell apex-missing-cpu: source 'src/missing' not found" in msg


@pytest.mark.parametrize("entry, expected", [
    ('name = "megatron-deepspeed"\nsources = ["src/apex-env"]', "megatron-deepspeed is not built into a wheel by a matrix"),
    ('name = "apex"\nversions = ["1.14"]', "apex cannot be fetched as apex==1.14"),
    ('name = "flash-attn"\nversions = ["2.8.3"]\nops = ["x"]', "flash-attn takes no ops"),
    ('name = "deepspeed"\nversions = ["0.19.x"]', "'0.19.x' is not a version"),
])
def test_cells_porter_cannot_build_are_refused(project: Path, entry: str, expected: str) -> None:
    write(project / "x.toml", f'toolchains = ["cpu"]\n[[component]]\n{entry}\n')
    with pytest.raises(ConfigError, match="problem") as err:
        load_matrix(project / "x.toml", directory=project / "d", environ={})
    assert expected in err.value.message


def test_two_cells_that_would_write_one_wheel_are_refused(project: Path) -> None:
    write(project / "profiles" / "same.toml", 'extends = "cpu"\n')  # same label as cpu
    write(project / "x.toml", 'toolchains = ["cpu", "profiles/same.toml"]\n'
                              '[[component]]\nname = "apex"\nsources = ["src/apex-env"]\n')
    with pytest.raises(ConfigError) as err:
        load_matrix(project / "x.toml", directory=project / "d", environ={})
    assert "cells apex-apex-env-cpu and apex-apex-env-same: both would write the same wheel" in err.value.message


def test_the_same_cell_twice_needs_a_tag(project: Path) -> None:
    entry = '[[component]]\nname = "apex"\nsources = ["src/apex-env"]\n'
    write(project / "x.toml", 'toolchains = ["cpu"]\n' + entry + entry)
    with pytest.raises(ConfigError, match="defined twice.*'tag'"):
        load_matrix(project / "x.toml", directory=project / "d", environ={})


@pytest.mark.parametrize("text, expected", [
    ('toolchain = ["cpu"]', "unknown key 'toolchain' (did you mean 'toolchains'?)"),
    ('toolchains = ["cpu"]\n[[component]]\nname = "apex"\nsource = ["x"]', "unknown key 'source'"),
    ('toolchains = ["cpu"]\n[[component]]\nname = "apex"\nsources = ["src/apex-env"]\n[slurm]\nparition = "x"',
     "unknown key 'parition' in [slurm] (did you mean 'partition'?)"),
    ('toolchains = ["cpu"]', "no [[component]] entries"),
    ('[[component]]\nname = "apex"\nsources = ["src/apex-env"]', "no toolchains"),
    ('toolchains = ["cpu"]\n[[component]]\nname = "apex"\nsources = ["src/apex-env"]\nargs = ["-o", "x"]',
     "'args' may not set -o"),
    ('toolchains = "cpu"', "'toolchains' must be a list"),
    ('toolchains = [', "invalid TOML"),
])
def test_bad_files_name_the_key(project: Path, text: str, expected: str) -> None:
    write(project / "x.toml", text + "\n")
    with pytest.raises(ConfigError) as err:
        load_matrix(project / "x.toml", directory=project / "d", environ={})
    assert expected in err.value.message


def test_the_folder_comes_from_the_command_line_or_the_file(project: Path) -> None:
    with pytest.raises(ConfigError, match="no matrix folder") as err:
        load_matrix(project / "m.toml", environ={})
    assert "--dir" in (err.value.hint or "")
    write(project / "m.toml", 'dir = "out/m"\nwheelhouse = "/shared/wh"\n' + (project / "m.toml").read_text())
    m = load_matrix(project / "m.toml", environ={})
    assert m.dir == project / "out" / "m" and m.wheelhouse == Path("/shared/wh")
    assert load_matrix(project / "m.toml", directory=project / "x", wheelhouse=project / "w", environ={}).wheelhouse \
        == project / "w"


# ------------------------------------------------------------------------------------------ Slurm

def test_slurm_settings_are_checked_and_the_command_line_wins() -> None:
    base = sl.SlurmSettings.from_table({"partition": "batch", "time": "1:00:00", "sbatch_args": ["--qos=x"]}, "m")
    merged = base.merged({"partition": None, "account": "abc", "time": "2:00:00", "sbatch_args": ("--gres=gpu:1",)})
    assert (merged.partition, merged.account, merged.time) == ("batch", "abc", "2:00:00")
    assert merged.sbatch_args == ("--qos=x", "--gres=gpu:1") and merged.max_parallel == 8
    cases: list[tuple[dict[str, Any], str]] = [
        ({"time": "2 hours"}, "not a Slurm time"), ({"mem": "lots"}, "memory size"), ({"cpus_per_task": 0}, ">= 1"),
        ({"sbatch_args": ["--array=0-3"]}, "sets --array itself"), ({"partition": "a b"}, "not a Slurm name"),
        ({"time": 60}, "must be a string")]
    for bad, match in cases:
        with pytest.raises(ConfigError, match=match):
            sl.SlurmSettings.from_table(bad, "m")


def test_array_is_held_capped_and_the_index_waits_on_afterok(tmp_path: Path) -> None:
    s = sl.SlurmSettings(partition="batch", account="abc", time="2:00:00", cpus_per_task=4, mem="8G",
                         max_parallel=2, index_time="10", sbatch_args=("--constraint=nvme",))
    folder = JobFolder(tmp_path, "cell", "index")
    a = folder.array_argv("sbatch", name="porter-matrix-t", tasks=3, settings=s)
    assert a[:5] == ["sbatch", "--parsable", "--hold", "--job-name=porter-matrix-t", "--array=0-2%2"]
    assert {"--partition=batch", "--account=abc", "--constraint=nvme", "--time=2:00:00", "--cpus-per-task=4",
            "--mem=8G", f"--output={tmp_path}/logs/cell-%a.log"} <= set(a) and a[-1] == str(folder.task_script)
    i = folder.final_argv("sbatch", name="porter-matrix-t", array_job="41", settings=s)
    assert "--dependency=afterok:41" in i and "--kill-on-invalid-dep=yes" in i and "--hold" not in i
    assert "--time=10" in i and "--cpus-per-task=1" in i and "--mem=8G" not in i
    assert folder.array_argv("sbatch", name="n", tasks=1, settings=sl.SlurmSettings())[4] == "--array=0-0%1"


def test_submit_holds_then_releases_and_cancels_what_it_submitted_on_failure(tmp_path: Path) -> None:
    env = sbin(tmp_path, "sbatch", "scontrol", "scancel")
    programs = sl.programs_or_refusal(env, Runner())[0]
    ids = iter(["sbatch: warning: something\n41;cluster\n", "42\n"])
    runner = FakeRunner(answers={"sbatch": lambda a: (0, next(ids))})
    folder = JobFolder(tmp_path, "cell", "index")
    sub = folder.submit(name="n", tasks=2, settings=sl.SlurmSettings(), programs=programs, runner=runner, env=env)
    assert (sub["array_job"], sub["index_job"]) == ("41", "42")
    assert [Path(r[0]).name for r in runner.ran] == ["sbatch", "sbatch", "scontrol"]
    assert runner.ran[2][1:] == ["release", "41"] and runner.envs[0] == env
    calls = iter([(0, "41\n"), (1, "sbatch: error: Invalid account")])
    failing = FakeRunner(answers={"sbatch": lambda a: next(calls)})
    with pytest.raises(CommandFailed):
        folder.submit(name="n", tasks=2, settings=sl.SlurmSettings(), programs=programs, runner=failing, env=env)
    assert failing.ran[-1][1:] == ["41"] and Path(failing.ran[-1][0]).name == "scancel"
    assert not any(Path(r[0]).name == "scontrol" for r in failing.ran)


def test_sbatch_missing_names_local(tmp_path: Path) -> None:
    with pytest.raises(ToolError) as err:
        sl.programs_or_refusal(sbin(tmp_path, "scontrol"), Runner())
    assert "sbatch not found" in err.value.message and "--local" in (err.value.hint or "")


def test_wait_stops_when_the_index_job_ended_without_a_report(tmp_path: Path) -> None:
    env = sbin(tmp_path, "sbatch", "scontrol", "squeue")
    programs = sl.programs_or_refusal(env, Runner())[0]
    states = iter(["PENDING\n", "CANCELLED\n"])
    runner = FakeRunner(answers={"squeue": lambda a: (0, next(states))})
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    folder, sub = JobFolder(tmp_path, "cell", "index"), {"array_job": "41", "index_job": "42"}
    with pytest.raises(ToolError, match="index job 42 ended \\(CANCELLED\\)") as err:
        folder.wait(tmp_path / "report.json", sub, programs=programs, runner=runner, env=env, sleep=sleep,
                    clock=lambda: now[0])
    assert "afterok:41" in (err.value.hint or "") and "porter matrix finish" in (err.value.hint or "")
    assert [r[1:] for r in runner.ran] == [["-h", "-t", "all", "-j", "42", "-o", "%T"]] * 2

    def lands(s: float) -> None:
        now[0] += s
        (tmp_path / "report.json").write_text("{}")

    folder.wait(tmp_path / "report.json", sub, programs=programs, runner=FakeRunner(), env=env, sleep=lands,
                clock=lambda: now[0])


# ------------------------------------------------------------------------------ cells and the report

def fake_build(fail: frozenset[str] = frozenset(), partial: frozenset[str] = frozenset()
               ) -> Callable[[list[str]], tuple[int, str]]:
    """Plays `python -m porter build --request FILE -o OUT`: writes a wheel and its manifest into OUT."""

    def build(argv: list[str]) -> tuple[int, str]:
        assert argv[3:5] == ["build", "--request"]
        out = Path(argv[argv.index("-o") + 1])
        request = json.loads(Path(argv[5]).read_text())
        source, tc = request["options"]["source"], request["options"]["toolchain_ref"]
        label = "cpu.x86.64.v3" if tc.endswith("cpu-v3.toml") else "cpu.x86.64.v2"
        if source in fail or tc in fail:
            return 1, ("x.cpp:3:5: error: 'nope' was not declared\nERROR: command failed with exit code 1: "
                       "/py\n")
        name = request["component"]
        version = f"{'0.19.8' if name == 'deepspeed' else '1.14.0a0'}+{label}"
        whl = make_wheel(out, name, version, {f"{name}/__init__.py": b""})
        extra: dict[str, Any] = {}
        if source in partial:
            extra["ops"] = [{"name": "cpu_adam", "status": "built"}, {"name": "cpu_lion", "status": "failed"}]
        make_manifest(whl, component=name, version=version, **extra)
        return (3 if source in partial else 0), f"wrote {whl}\n"

    return build


def planned(project: Path) -> tuple[Path, Matrix]:
    plan = load_matrix(project / "m.toml", directory=project / "d", environ={})
    write_plan(plan, force=False)
    return project / "d", plan


def test_write_plan_lays_out_the_folder_and_scripts(project: Path) -> None:
    d, _ = planned(project)
    plan = read_plan(d)
    assert len(plan.cells) == 3 and (d / "cells" / "apex-apex-env-cpu").is_dir() and (d / "wheelhouse").is_dir()
    script = (d / "jobs" / "cell.sh").read_text()
    assert script.startswith("#!/bin/bash\n") and os.access(d / "jobs" / "cell.sh", os.X_OK)
    assert f"-m porter matrix cell {d} " in script and "SLURM_ARRAY_TASK_ID" in script
    assert f"-m porter matrix finish {d}" in (d / "jobs" / "index.sh").read_text()
    with pytest.raises(ConfigError, match="already holds a matrix") as err:
        write_plan(plan, force=False)
    assert "--force" in (err.value.hint or "")
    (d / "cells" / "apex-apex-env-cpu" / "result.json").write_text("{}")
    write_plan(plan, force=True)
    assert not (d / "cells" / "apex-apex-env-cpu" / "result.json").exists()


def test_unwritable_shared_dir_is_refused_before_anything(project: Path) -> None:
    blocker = project / "a-file"
    blocker.write_text("")
    m = load_matrix(project / "m.toml", directory=blocker / "d", environ={})
    runner = FakeRunner()
    with pytest.raises(ConfigError, match="cannot create the matrix folder") as err:
        run_matrix(m, mode="slurm", force=False, runner=runner, env=sbin(project, "sbatch", "scontrol"))
    assert err.value.exit_code == 2 and "--dir" in (err.value.hint or "") and runner.ran == []


def test_a_cell_records_its_wheel_and_a_failed_cell_its_log(project: Path) -> None:
    d, _ = planned(project)
    runner = FakeRunner()
    runner.answers[Path(read_plan(d).python).name] = fake_build(fail=frozenset({"deepspeed==0.19.8"}))
    env = {"SLURM_JOB_ID": "43", "SLURM_ARRAY_JOB_ID": "41", "SLURM_ARRAY_TASK_ID": "0"}
    ok = run_cell(d, 0, runner=runner, env=env)
    assert ok["status"] == "built" and ok["slurm"] == {"job_id": "43", "array_job_id": "41", "array_task_id": "0"}
    wheel = d / "wheelhouse" / ok["wheel"]
    assert wheel.is_file() and Path(str(wheel) + ".porter.json").is_file()
    assert runner.ran[0][-2:] == ["-o", str(d / "cells" / "apex-apex-env-cpu" / "out")]
    bad = run_cell(d, 2, runner=runner, env={})
    assert bad["status"] == "failed" and bad["returncode"] == 1
    assert bad["error"] == "x.cpp:3:5: error: 'nope' was not declared"  # the compiler's own line, as porter reads it everywhere
    log = Path(bad["log"])
    assert log == d / "cells" / "deepspeed-0.19.8-cpu" / "build.log" and "not declared" in log.read_text()
    assert json.loads((d / "cells" / "deepspeed-0.19.8-cpu" / "result.json").read_text())["status"] == "failed"
    with pytest.raises(ConfigError, match="no cell 7"):
        run_cell(d, 7, runner=runner, env={})


def test_finish_indexes_the_good_wheels_and_reports_every_cell(project: Path) -> None:
    d, plan = planned(project)
    runner = FakeRunner()
    runner.answers[Path(read_plan(d).python).name] = fake_build(fail=frozenset({str(project / "profiles" / "cpu-v3.toml")}))
    for i in range(3):
        run_cell(d, i, runner=runner, env={})
    report = finish(d)
    assert json.loads((d / REPORT).read_text()) == report
    by_id = {c["id"]: c for c in report["cells"]}
    assert by_id["apex-apex-env-cpu"]["status"] == "built"
    assert by_id["apex-apex-env-cpu"]["version"] == "1.14.0a0+cpu.x86.64.v2"
    assert by_id["apex-apex-env-cpu-v3"]["status"] == "failed"
    assert by_id["apex-apex-env-cpu-v3"]["log"].endswith("cells/apex-apex-env-cpu-v3/build.log")
    assert report["counts"] == {"built": 2, "failed": 1} and report["index"]["wheels"] == 2
    index = json.loads((d / "wheelhouse" / "porter-wheelhouse.json").read_text())
    assert sorted(w["component"] for w in index["wheels"]) == ["apex", "deepspeed"]
    err = outcome(report)
    assert isinstance(err, PartialSuccess) and "apex-apex-env-cpu-v3 (failed)" in err.message


def test_a_partial_build_ships_and_names_its_failed_ops(project: Path) -> None:
    d, _ = planned(project)
    runner = FakeRunner()
    runner.answers[Path(read_plan(d).python).name] = fake_build(partial=frozenset({"deepspeed==0.19.8"}))
    doc = run_cell(d, 2, runner=runner, env={})
    assert doc["status"] == "partial" and doc["wheel"].startswith("deepspeed-0.19.8+cpu")
    entry = status(d)["cells"][2]
    assert entry["failed_ops"] == ["cpu_lion"] and entry["status"] == "partial"


def test_status_before_and_after_the_index(project: Path) -> None:
    d, _ = planned(project)
    runner = FakeRunner()
    runner.answers[Path(read_plan(d).python).name] = fake_build()
    run_cell(d, 0, runner=runner, env={})
    (d / "cells" / "apex-apex-env-cpu-v3" / "result.json").write_text(json.dumps(
        {"status": "running", "host": "n1", "started": "T"}))
    now = status(d)
    assert now["state"] == "planned" and [c["status"] for c in now["cells"]] == ["built", "incomplete", "not run"]
    assert "still running, or killed" in now["cells"][1]["error"]
    assert now["cells"][2]["job_log"] == str(d / "logs" / "cell-2.log")
    run_cell(d, 1, runner=runner, env={})
    run_cell(d, 2, runner=runner, env={})
    finish(d)
    done = status(d)
    assert done["state"] == "finished" and outcome(done) is None


def test_nothing_built_is_a_failure() -> None:
    doc = {"name": "t", "dir": "/d", "cells": [{"id": "a", "status": "failed"}], "index_error": "no cell built"}
    assert isinstance(outcome(doc), CheckFailed)


def test_local_runs_the_same_scripts_then_the_index(project: Path) -> None:
    d, _ = planned(project)
    plan = read_plan(d)
    inner = FakeRunner()
    inner.answers[Path(plan.python).name] = fake_build()

    def bash(argv: list[str]) -> tuple[int, str]:  # plays the two job scripts
        if argv[1].endswith("cell.sh"):
            run_cell(d, int(argv[2]), runner=inner, env={})
            return 0, f"cell {argv[2]}\n"
        finish(d)
        return 0, "indexed\n"

    runner = FakeRunner(answers={"bash": bash})
    report = run_local(plan, runner=runner, env={})
    assert [r[1:] for r in runner.ran] == [[str(d / "jobs" / "cell.sh"), str(i)] for i in range(3)] + \
        [[str(d / "jobs" / "index.sh")]]
    assert report["counts"] == {"built": 3} and (d / "logs" / "cell-1.log").read_text() == "cell 1\n"
    assert (d / "logs" / "index.log").read_text() == "indexed\n"


def test_local_does_not_index_after_a_lost_cell(project: Path) -> None:
    d, _ = planned(project)
    runner = FakeRunner(answers={"bash": lambda a: (137, "Killed\n") if a[-1] == "1" else (0, "")})
    with pytest.raises(ToolError, match="1 cell job\\(s\\) ended without a result: apex-apex-env-cpu-v3"):
        run_local(read_plan(d), runner=runner, env={})
    assert not any(r[1].endswith("index.sh") for r in runner.ran)


def test_slurm_run_writes_the_plan_submits_and_records_the_jobs(project: Path) -> None:
    m = load_matrix(project / "m.toml", directory=project / "d", environ={})
    env = sbin(project, "sbatch", "scontrol", "squeue", "scancel")
    ids = iter(["41\n", "42\n"])
    runner = FakeRunner(answers={"sbatch": lambda a: (0, next(ids))})
    result = run_matrix(m, mode="slurm", force=False, runner=runner, env=env,
                        settings=m.slurm.merged({"account": "abc"}))
    sub = json.loads((project / "d" / SUBMISSION).read_text())
    assert sub["array_job"] == "41" and sub["index_job"] == "42" and sub["settings"]["account"] == "abc"
    assert result.report is None and (project / "d" / PLAN).exists()
    assert "--array=0-2%2" in runner.ran[0] and "--partition=batch" in runner.ran[0]
    assert "--account=abc" in runner.ran[1] and "--dependency=afterok:41" in runner.ran[1]
    assert status(project / "d")["state"] == "submitted"


def test_dry_run_writes_nothing_and_shows_the_submission(project: Path) -> None:
    m = load_matrix(project / "m.toml", directory=project / "d", environ={})
    runner = FakeRunner(dry=True)
    res = run_matrix(m, mode="slurm", force=False, runner=runner, env={"PATH": str(project / "empty")})
    text = "\n".join(res.dry_run or [])
    assert not (project / "d").exists() and runner.ran == []
    assert '"component": "apex"' in text and "build --request" in text and "--dependency=afterok:<array-job>" in text
    assert text.splitlines()[-1].startswith("# a real run here would be refused: sbatch and scontrol not found")


# ------------------------------------------------------------------------------------------ the CLI

def invoke(*args: str) -> tuple[int, str, BaseException | None]:
    result = CliRunner().invoke(cli, ["-q", *args])
    return result.exit_code, result.stdout, result.exception


def test_cli_needs_local_or_slurm(project: Path) -> None:
    code, _, _ = invoke("matrix", "run", str(project / "m.toml"), "--dir", str(project / "d"))
    assert code == 2 and not (project / "d").exists()


def test_cli_unknown_toolchain_is_refused_before_submission(project: Path) -> None:
    write(project / "x.toml", 'toolchains = ["cpu", "frontierr"]\n[[component]]\nname = "apex"\n'
                              'sources = ["src/apex-env"]\n')
    code, _, exc = invoke("matrix", "run", str(project / "x.toml"), "--slurm", "--dir", str(project / "d"))
    assert isinstance(exc, ConfigError) and exc.exit_code == 2
    assert "cell apex-apex-env-frontierr: toolchain 'frontierr'" in exc.message
    assert not (project / "d").exists()


def test_cli_status_of_a_folder_without_a_matrix(tmp_path: Path) -> None:
    code, _, exc = invoke("matrix", "status", str(tmp_path))
    assert isinstance(exc, ConfigError) and "holds no matrix" in exc.message
