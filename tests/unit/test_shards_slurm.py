"""porter ops build --shards N --slurm: the two job scripts, the held array and the link job's afterok, the
refusals, the status read back from the folder (no subprocess: a fake runner plays sbatch and scontrol)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner

from porter.cli import cli
from porter.cluster.request import BuildRequest
from porter.cluster.slurm import shards as sh
from porter.cluster.slurm import sbatch as sl
from porter.errors import CheckFailed, CommandFailed, ConfigError, ToolError
from porter.run import Result, Runner

FACTS = sh.BuildFacts(build_dir=Path("/shared/cache/ops/deepspeed-0.19.8-cpu-0123456789abcdef"), compile_steps=4)


@dataclass
class FakeRunner(Runner):
    """Answers by program name; records every command."""

    answers: dict[str, Callable[[list[str]], tuple[int, str]]] = field(default_factory=dict)
    ran: list[list[str]] = field(default_factory=list)

    def run(self, argv: Sequence[str | os.PathLike[str]], *, env: Mapping[str, str] | None = None,
            cwd: str | os.PathLike[str] | None = None, timeout: float | None = None, check: bool = True,
            hint: str | None = None, input: str | None = None) -> Result:
        args = [os.fspath(a) for a in argv]
        self.ran.append(args)
        answer = self.answers.get(Path(args[0]).name)
        code, out = answer(args) if answer else (0, "")
        if check and code:
            raise CommandFailed(args, code, out)
        return Result(args, code, out, 0.0)


def sbin(tmp_path: Path, *names: str) -> dict[str, str]:
    d = tmp_path / "sbin"
    d.mkdir(exist_ok=True)
    for n in names:
        (d / n).write_text("#!/bin/sh\n")
        (d / n).chmod(0o755)
    return {"PATH": str(d), "HOME": str(tmp_path)}


BUILD = BuildRequest("deepspeed", {"source": "/src/deepspeed-0.19.8.tar.gz", "toolchain_ref": "cpu",
                                   "ops": ["cpu_lion"]}, last={"link_only": True})


def request(tmp_path: Path, shards: int = 2, **kw: object) -> sh.ShardRequest:
    values: dict[str, object] = dict(build=BUILD, shards=shards, dir=tmp_path / "d",
                                     wheelhouse=tmp_path / "wh", cache=tmp_path / "cache", python="/venv/bin/python")
    values.update(kw)
    return sh.ShardRequest(**values)  # type: ignore[arg-type]


def planner(facts: sh.BuildFacts = FACTS, calls: list[int] | None = None) -> Callable[[], sh.BuildFacts]:
    def plan() -> sh.BuildFacts:
        if calls is not None:
            calls.append(1)
        return facts
    return plan


# ------------------------------------------------------------------------------------------ the scripts

def test_the_shard_script_runs_the_same_build_with_its_array_index(tmp_path: Path) -> None:
    req = request(tmp_path).with_facts(FACTS)
    text = sh.scripts(req)[req.folder.task_script]
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert f"export PORTER_CACHE_DIR={tmp_path / 'cache'}" in lines  # every job sees the same build folder
    assert 'i="${1:-${SLURM_ARRAY_TASK_ID:?pass the shard index, or run as an array task}}"' in lines
    assert (f"/venv/bin/python -m porter build --request {tmp_path / 'd' / 'request.json'} "
            '--shard "$i/2" --json > "$results"/.shard-"$i".json.part') in lines
    assert lines[-1] == 'exit "$code"' and "--last" not in text and " -o " not in text
    # the exit code lands last, renamed into place: status never reads half a result
    assert lines[-2].endswith('mv -f "$results"/.shard-"$i".exit.part "$results"/shard-"$i".exit')


def test_the_link_script_links_into_the_wheelhouse(tmp_path: Path) -> None:
    req = request(tmp_path).with_facts(FACTS)
    text = sh.scripts(req)[req.folder.final_script]
    cmd = next(ln for ln in text.splitlines() if "-m porter" in ln)
    assert cmd.startswith(f"/venv/bin/python -m porter build --request {tmp_path / 'd' / 'request.json'} --last "
                          f"-o {tmp_path / 'wh'} --json > ")
    assert "--shard" not in text and text.rstrip().endswith('exit "$code"')
    assert req.name == "porter-deepspeed-0.19.8-cpu"


def test_the_request_refuses_options_its_runner_sets(tmp_path: Path) -> None:
    for bad in ("shard", "shards", "dry_run", "as_json"):
        with pytest.raises(ConfigError, match=f"may not set {bad}"):
            request(tmp_path, build=BuildRequest("deepspeed", {"source": "s", bad: True}))
    with pytest.raises(ConfigError, match="whole number >= 1"):
        request(tmp_path, shards=0)


# ------------------------------------------------------------------------------------- submission

def test_submit_holds_the_array_then_the_link_waits_on_afterok(tmp_path: Path) -> None:
    env = sbin(tmp_path, "sbatch", "scontrol", "squeue", "scancel")
    ids = iter(["41\n", "42\n"])
    runner = FakeRunner(answers={"sbatch": lambda a: (0, next(ids))})
    settings = sl.SlurmSettings(max_parallel=2).merged({"partition": "batch", "time": "1:00:00", "mem": "8G"})
    run = sh.submit_build(request(tmp_path), planner(), settings=settings, runner=runner, env=env)
    array, link, release = runner.ran
    d = tmp_path / "d"
    assert array[1:6] == ["--parsable", "--hold", "--job-name=porter-deepspeed-0.19.8-cpu", "--array=0-1%2",
                          f"--chdir={d}"]
    assert {f"--output={d}/logs/shard-%a.log", "--partition=batch", "--time=1:00:00", "--mem=8G"} <= set(array)
    assert array[-1] == str(d / "jobs" / "shard.sh")
    assert "--dependency=afterok:41" in link and "--kill-on-invalid-dep=yes" in link and "--hold" not in link
    assert f"--output={d}/logs/link.log" in link and "--job-name=porter-deepspeed-0.19.8-cpu-link" in link
    assert link[-1] == str(d / "jobs" / "link.sh") and "--partition=batch" in link and "--mem=8G" not in link
    assert release[1:] == ["release", "41"]
    sub = json.loads((d / "submission.json").read_text())
    assert (sub["array_job"], sub["link_job"]) == ("41", "42") and sub["array_argv"] == array
    doc = run.to_dict()
    assert doc["array_job"] == "41" and doc["link_job"] == "42" and doc["wheelhouse"] == str(tmp_path / "wh")
    assert doc["scripts"] == {"shard": str(d / "jobs" / "shard.sh"), "link": str(d / "jobs" / "link.sh")}
    assert doc["build_dir"] == str(FACTS.build_dir) and doc["status_command"] == f"porter ops status {d}"
    assert (d / "jobs" / "shard.sh").stat().st_mode & 0o111 and (d / "shards.json").is_file()
    assert sh.status(d)["state"] == "submitted"


def test_the_folder_defaults_to_the_cache_beside_the_build(tmp_path: Path) -> None:
    env = sbin(tmp_path, "sbatch", "scontrol")
    ids = iter(["41\n", "42\n"])
    runner = FakeRunner(answers={"sbatch": lambda a: (0, next(ids))})
    run = sh.submit_build(request(tmp_path, dir=Path()), planner(), settings=sl.SlurmSettings(), runner=runner,
                          env=env, dir_given=False)
    assert run.request.dir == tmp_path / "cache" / "shards" / FACTS.build_dir.name
    assert (run.request.dir / "jobs" / "link.sh").is_file()


def test_a_failed_second_sbatch_cancels_the_array(tmp_path: Path) -> None:
    env = sbin(tmp_path, "sbatch", "scontrol", "scancel")
    calls = iter([(0, "41\n"), (1, "sbatch: error: Invalid account")])
    runner = FakeRunner(answers={"sbatch": lambda a: next(calls)})
    with pytest.raises(CommandFailed):
        sh.submit_build(request(tmp_path), planner(), settings=sl.SlurmSettings(), runner=runner, env=env)
    assert Path(runner.ran[-1][0]).name == "scancel" and runner.ran[-1][1:] == ["41"]


def test_wait_returns_the_link_jobs_wheel(tmp_path: Path) -> None:
    env = sbin(tmp_path, "sbatch", "scontrol", "squeue")
    results = tmp_path / "d" / "results"

    def sbatch(argv: list[str]) -> tuple[int, str]:
        if argv[-1].endswith("link.sh"):  # the jobs "run" as soon as the link job is queued
            for i in (0, 1):
                (results / f"shard-{i}.exit").write_text("0\n")
            (results / "link.json").write_text(json.dumps({"wheel": str(tmp_path / "wh" / "x.whl")}))
            (results / "link.exit").write_text("0\n")
            return 0, "42\n"
        return 0, "41\n"

    run = sh.submit_build(request(tmp_path), planner(), settings=sl.SlurmSettings(), env=env, wait=True, poll=0.01,
                          runner=FakeRunner(answers={"sbatch": sbatch}))
    assert run.status is not None and run.status["state"] == "finished"
    assert run.to_dict()["wheel"] == str(tmp_path / "wh" / "x.whl")


# ------------------------------------------------------------------------------------------ refusals

def test_sbatch_missing_names_the_local_build_before_any_work(tmp_path: Path) -> None:
    calls: list[int] = []
    with pytest.raises(ToolError) as err:
        sh.submit_build(request(tmp_path), planner(calls=calls), settings=sl.SlurmSettings(), runner=FakeRunner(),
                        env={"PATH": str(tmp_path / "empty")})
    assert "sbatch and scontrol not found on PATH: --slurm submits the shards" in err.value.message
    assert "drop --slurm" in (err.value.hint or "") and "--shard I/N" in (err.value.hint or "")
    assert calls == [] and not (tmp_path / "d").exists()


def test_more_shards_than_compile_steps_and_a_refused_build_submit_nothing(tmp_path: Path) -> None:
    env = sbin(tmp_path, "sbatch", "scontrol")
    runner = FakeRunner()
    with pytest.raises(ConfigError, match="5 shards for 4 compile step") as err:
        sh.submit_build(request(tmp_path, shards=5), planner(), settings=sl.SlurmSettings(), runner=runner, env=env)
    assert "--shards 4" in (err.value.hint or "")
    refused = sh.BuildFacts(FACTS.build_dir, 4, refusal="torch 2.13.0+cpu cannot build ops for rocm")
    with pytest.raises(CheckFailed, match="would be refused: torch"):
        sh.submit_build(request(tmp_path), planner(refused), settings=sl.SlurmSettings(), runner=runner, env=env)
    assert runner.ran == [] and not (tmp_path / "d").exists()


def test_unwritable_shared_folders_are_refused_before_planning(tmp_path: Path) -> None:
    env = sbin(tmp_path, "sbatch", "scontrol")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    calls: list[int] = []
    for kw, words in (({"dir": blocker / "d"}, "shards folder"), ({"wheelhouse": blocker / "wh"}, "wheelhouse"),
                      ({"cache": blocker / "c"}, "porter cache")):
        with pytest.raises(ConfigError, match=words) as err:
            sh.submit_build(request(tmp_path, **kw), planner(calls=calls), settings=sl.SlurmSettings(),
                            runner=FakeRunner(), env=env)
        assert str(blocker) in err.value.message
    assert calls == []


def test_dry_run_prints_the_scripts_and_the_submission_and_writes_nothing(tmp_path: Path) -> None:
    runner = FakeRunner(dry=True)
    run = sh.submit_build(request(tmp_path), planner(), settings=sl.SlurmSettings(max_parallel=2), runner=runner,
                          env={"PATH": str(tmp_path / "empty")})
    lines = run.dry_run or []
    text = "\n".join(lines)
    assert runner.ran == [] and not (tmp_path / "d").exists() and not (tmp_path / "wh").exists()
    assert f"# --- {tmp_path / 'd' / 'jobs' / 'shard.sh'}" in lines and '--shard "$i/2" --json' in text
    assert "sbatch --parsable --hold" in text and "'--dependency=afterok:<array-job>'" in text
    assert "scontrol release '<array-job>'" in text
    assert lines[-1].startswith("# a real run here would be refused: sbatch and scontrol not found")


# ------------------------------------------------------------------------------------------ status

def _written(tmp_path: Path) -> Path:
    req = request(tmp_path).with_facts(FACTS)
    sh.write_jobs(req)
    return req.dir


def test_status_follows_the_shards_and_the_link_from_the_files(tmp_path: Path) -> None:
    d = _written(tmp_path)
    doc = sh.status(d)
    assert doc["state"] == "planned" and [t["status"] for t in doc["tasks"]] == ["pending", "pending"]
    (d / "logs" / "shard-0.log").write_text("")
    (d / "results" / "shard-1.json").write_text(json.dumps({"shard": {"objects": ["a.o"]}, "seconds": 3.0}))
    (d / "results" / "shard-1.exit").write_text("0\n")
    doc = sh.status(d)
    assert [(t["status"], t.get("objects")) for t in doc["tasks"]] == [("started", None), ("done", 1)]
    assert doc["link"]["status"] == "pending" and sh.outcome(doc) is None
    (d / "results" / "shard-0.exit").write_text("0\n")
    (d / "results" / "link.json").write_text(json.dumps({"wheel": "/wh/x.whl", "manifest": "/wh/x.whl.json"}))
    (d / "results" / "link.exit").write_text("0\n")
    doc = sh.status(d)
    assert doc["state"] == "finished" and doc["link"]["wheel"] == "/wh/x.whl" and sh.outcome(doc) is None
    assert "  link      done     wheel /wh/x.whl" in sh.describe(doc)


def test_a_failed_shard_cancels_the_link_and_names_its_log(tmp_path: Path) -> None:
    d = _written(tmp_path)
    (d / "results" / "shard-0.exit").write_text("1\n")
    doc = sh.status(d)
    assert doc["state"] == "failed" and doc["link"]["status"] == "cancelled"
    err = sh.outcome(doc)
    assert isinstance(err, CheckFailed) and "1 shard(s) failed: 0" in err.message
    assert str(d / "logs" / "shard-0.log") in (err.hint or "")
    with pytest.raises(ConfigError, match="holds no sharded build"):
        sh.status(tmp_path / "elsewhere")


# ------------------------------------------------------------------------------------------ the CLI

def invoke(*args: str, env: Mapping[str, str] | None = None) -> tuple[int, str, BaseException | None]:
    result = CliRunner().invoke(cli, ["-q", "ops", "build", "--source", "deepspeed==0.19.8", "--ops", "cpu_lion",
                                      *args], env=dict(env or {}))
    return result.exit_code, result.output, result.exception


@pytest.mark.parametrize(("args", "words"), [
    (("--shards", "2", "--slurm", "--shard", "0/2"), "--shard I/N and --link-only are what those jobs run"),
    (("--shards", "2", "--slurm", "--link-only"), "--shard I/N and --link-only are what those jobs run"),
    (("--shards", "2"), "--shards N and --slurm go together"),
    (("--slurm",), "--shards N and --slurm go together"),
    (("--shards", "0", "--slurm"), "0 is not in the range x>=1"),
    (("--shards", "2", "--slurm", "--compile-only"), "--compile-only is not sharded"),
    (("--partition", "batch"), "--partition: only with --shards N --slurm"),
    (("--wait", "--dir", "x"), "--wait, --dir: only with --shards N --slurm"),
])
def test_cli_refuses_what_does_not_go_with_shards(args: tuple[str, ...], words: str) -> None:
    code, out, _ = invoke(*args)
    assert code == 2 and words in out, out


def test_cli_slurm_settings_from_the_env_do_not_disturb_a_local_build(tmp_path: Path) -> None:
    # PORTER_SLURM_* in the environment is not a command-line option: a plain build is not refused for it
    code, out, _ = invoke("--dry-run", "--shards", "0", env={"PORTER_SLURM_PARTITION": "batch"})
    assert "only with --shards" not in out and code == 2  # refused for --shards 0 alone


def test_cli_sbatch_missing_is_a_tool_error_naming_the_local_build(tmp_path: Path) -> None:
    code, _, exc = invoke("--shards", "2", "--slurm", "-o", str(tmp_path / "wh"), "--dir", str(tmp_path / "d"),
                          env={"PATH": str(tmp_path / "empty"), "PORTER_CACHE_DIR": str(tmp_path / "cache")})
    assert isinstance(exc, ToolError) and exc.exit_code == 1
    assert "sbatch and scontrol not found" in exc.message and "drop --slurm" in (exc.hint or "")
    assert not (tmp_path / "d").exists() and not (tmp_path / "cache").exists()
