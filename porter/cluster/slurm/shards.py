"""One build split into shards on Slurm: a job array of N tasks, each compiling one shard of the plan's compile
steps into the shared build folder (and compiler cache), then one link-and-package job after all of them.

```
DIR/shards.json            the sharded build, frozen at submission: N, where things land, the build below
DIR/request.json           the build every job runs (porter.cluster.request), frozen at submission
DIR/jobs/shard.sh          one shard: `porter build --request DIR/request.json --shard I/N` (I = the array task id)
DIR/jobs/link.sh           the last step: `porter build --request DIR/request.json --last -o WHEELHOUSE`
DIR/results/shard-I.json   the shard's --json report; shard-I.exit its exit code
DIR/results/link.json      the link job's --json report (wheel, manifest); link.exit its exit code
DIR/logs/shard-I.log       each task's own output (Slurm's --output); logs/link.log the link job's
DIR/submission.json        the Slurm job ids and the sbatch commands
WHEELHOUSE/                the wheel and its manifest, written by the link job
```

The array is submitted held, the link job with ``afterok`` on it, then the array is released (the
matrix's submission, :meth:`porter.cluster.slurm.sbatch.JobFolder.submit`). A shard that fails exits non-zero: the link
could only refuse (an object is missing), so ``afterok`` never holds and Slurm cancels the link job;
``porter ops status DIR`` names the shard and its log. Every job sees the same porter cache (the build
folder and the compiler cache live in it): the scripts export ``PORTER_CACHE_DIR`` as it was at
submission, so it must be on a filesystem every node sees.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from porter import __version__
from porter.cluster.request import BuildRequest, jsonable
from porter.cluster.slurm import sbatch as sl
from porter.cluster.slurm.sbatch import JobFolder, read_exit_code, read_json
from porter.errors import CheckFailed, ConfigError, PorterError
from porter.fs import atomic_write_json, ensure_writable_dir, read_folder_document
from porter.log import Logger, quiet_logger
from porter.run import Runner

REQUEST = "shards.json"
BUILD_REQUEST = "request.json"
SCHEMA = "porter.shards/2"
LOCAL = ("build here in one run (drop --slurm and --shards), or run the build with --shard I/N for each I yourself "
         "and then once with --link-only (--report-only for a compile-only build)")


@dataclass(frozen=True)
class BuildFacts:
    """What the build's plan says, read before anything is submitted (a dry run of the same build)."""

    build_dir: Path
    """The build folder every shard fills (under porter's cache)."""
    compile_steps: int
    refusal: str | None = None
    """Why a real build here would be refused (checked on the submitting host)."""

    @classmethod
    def of(cls, planned: Any) -> BuildFacts:
        """The facts of a build's dry run (its plan and refusal)."""
        return cls(build_dir=planned.plan.build_dir,
                   compile_steps=sum(1 for st in planned.plan.steps if st.kind == "compile"),
                   refusal=planned.refusal.message if planned.refusal else None)


@dataclass(frozen=True)
class ShardRequest:
    """A sharded build, as its jobs read it back from ``shards.json``."""

    build: BuildRequest
    """The build every job runs (``request.json``): each shard with ``--shard I/N``, the last with ``--last``."""
    shards: int
    dir: Path
    wheelhouse: Path
    cache: Path
    """porter's cache for every job (``PORTER_CACHE_DIR``): the build folder and ccache live in it."""
    python: str
    build_dir: Path = Path()
    """Filled from the plan (:class:`BuildFacts`) before anything is written."""
    compile_steps: int = 0
    name: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.shards, bool) or not isinstance(self.shards, int) or self.shards < 1:
            raise ConfigError(f"--shards must be a whole number >= 1, not {self.shards!r}")

    @property
    def folder(self) -> JobFolder:
        return JobFolder(self.dir, "shard", "link")

    @property
    def results(self) -> Path:
        return self.dir / "results"

    @property
    def request_file(self) -> Path:
        return self.dir / BUILD_REQUEST

    @property
    def link_exit(self) -> Path:
        """Written last by the link job: what ``--wait`` and ``status`` look for."""
        return self.results / "link.exit"

    def with_facts(self, facts: BuildFacts, *, dir_given: bool = True) -> ShardRequest:
        # the name that tells one build from another: the build folder's, or its parent's where the folder is a
        # build/ inside a per-build folder (porter wheel's work copy and build side by side)
        build = facts.build_dir
        key = build.parent.name if build.name == "build" else build.name
        name = f"porter-{key.rsplit('-', 1)[0]}" if key else f"porter-{self.build.component}"
        return dataclasses.replace(self, build_dir=facts.build_dir, compile_steps=facts.compile_steps, name=name,
                                   dir=self.dir if dir_given else self.cache / "shards" / key)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "porter_version": __version__, **jsonable(dataclasses.asdict(self)),
                "build": self.build.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], folder: Path) -> ShardRequest:
        return cls(build=BuildRequest.from_dict(data["build"], str(folder / REQUEST)), shards=int(data["shards"]),
                   dir=folder, wheelhouse=Path(data["wheelhouse"]), cache=Path(data["cache"]),
                   python=str(data["python"]), build_dir=Path(data["build_dir"]),
                   compile_steps=int(data["compile_steps"]), name=str(data.get("name", "")))


def read_request(directory: str | Path) -> ShardRequest:
    folder = Path(directory).resolve()
    data = read_folder_document(folder, REQUEST, SCHEMA, missing="sharded build",
                                missing_hint="pass the folder 'porter ops build --shards N --slurm' printed (its 'dir')",
                                unreadable_hint="submit the build again",
                                other_hint="submit the build with this porter version")
    return ShardRequest.from_dict(data, folder)


# ------------------------------------------------------------------------------------------ the two scripts

def _record(command: str, name: str) -> str:
    """Run ``command``: its JSON report into results/NAME.json and its exit code into results/NAME.exit
    (each renamed into place, the exit code last), then exit with that code."""
    return (f'{command} > "$results"/.{name}.json.part\n'
            "code=$?\n"
            f'mv -f "$results"/.{name}.json.part "$results"/{name}.json\n'
            f'echo "$code" > "$results"/.{name}.exit.part && mv -f "$results"/.{name}.exit.part "$results"/{name}.exit\n'
            'exit "$code"\n')


def scripts(req: ShardRequest) -> dict[Path, str]:
    """The text of ``jobs/shard.sh`` (one array task; ``bash shard.sh I`` by hand) and ``jobs/link.sh``."""
    folder, title = req.folder, f"{req.build.component} in {req.shards} shard(s)"
    exports, results = {"PORTER_CACHE_DIR": str(req.cache)}, f"results={shlex.quote(str(req.results))}\n"
    porter = [req.python, "-m", "porter", "build", "--request", str(req.request_file)]
    shard = folder.script(title, "one shard per array task (or: bash shard.sh INDEX)", exports=exports, body=(
        results + 'i="${1:-${SLURM_ARRAY_TASK_ID:?pass the shard index, or run as an array task}}"\n'
        + _record(f'{shlex.join(porter)} --shard "$i/{req.shards}" --json', 'shard-"$i"')))
    link = folder.script(title, "link and package after every shard (afterok)" if not req.build.reports
                         else "report every unit after every shard (afterok): it compiles nothing", exports=exports,
                         body=results + _record(shlex.join([*porter, "--last", "-o", str(req.wheelhouse), "--json"]),
                                                "link"))
    return {folder.task_script: shard, folder.final_script: link}


def write_jobs(req: ShardRequest) -> None:
    """Create the folder (earlier scripts, results and logs are replaced): the request and both scripts."""
    ensure_writable_dir(req.dir, what="shards folder", option="--dir", create=True)
    req.folder.reset("results")
    req.folder.write_scripts(*scripts(req).values())
    atomic_write_json(req.request_file, req.build.to_dict())
    atomic_write_json(req.dir / REQUEST, req.to_dict())


# ------------------------------------------------------------------------------------------------ status

def status(directory: str | Path) -> dict[str, Any]:
    """The sharded build now, read from its folder (never from Slurm's accounting): each shard done, failed,
    started (its log exists) or pending; the link job's wheel once it wrote one."""
    req = read_request(directory)
    tasks: list[dict[str, Any]] = []
    for i in range(req.shards):
        code = read_exit_code(req.results / f"shard-{i}.exit")
        entry: dict[str, Any] = {"index": i, "log": str(req.folder.task_log(i)), "exit_code": code}
        if code is None:
            entry["status"] = "started" if req.folder.task_log(i).exists() else "pending"
        else:
            entry["status"] = "done" if code == 0 else "failed"
            doc = read_json(req.results / f"shard-{i}.json")
            if doc and isinstance(doc.get("shard"), dict):
                entry["objects"] = len(doc["shard"].get("objects", []))
                entry["seconds"] = doc.get("seconds")
        tasks.append(entry)
    code = read_exit_code(req.link_exit)
    link: dict[str, Any] = {"log": str(req.folder.final_log), "exit_code": code, "wheel": None, "manifest": None}
    if code is not None:
        link["status"] = "done" if code == 0 else ("partial" if code == 3 else "failed")
        doc = read_json(req.results / "link.json") or {}
        link.update(wheel=doc.get("wheel"), manifest=doc.get("manifest"), seconds=doc.get("seconds"))
    elif any(t["status"] == "failed" for t in tasks):
        link["status"] = "cancelled"  # afterok never holds; Slurm drops the job (--kill-on-invalid-dep)
    else:
        link["status"] = "started" if req.folder.final_log.exists() else "pending"
    submission = req.folder.submission()
    state = ("failed" if link["status"] in ("failed", "cancelled") else
             "finished" if code is not None else "submitted" if submission else "planned")
    return {"dir": str(req.dir), "state": state, "shards": req.shards, "build_dir": str(req.build_dir),
            "wheelhouse": str(req.wheelhouse), "submission": submission, "tasks": tasks, "link": link}


def describe(doc: Mapping[str, Any]) -> list[str]:
    counts = Counter(t["status"] for t in doc["tasks"])
    sub = doc.get("submission") or {}
    lines = [f"[{doc['state']}] {doc['shards']} shard(s)"
             + (f" (array job {sub['array_job']}, link job {sub['link_job']})" if sub.get("array_job") else "")
             + ": " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))]
    for t in doc["tasks"]:
        what = f"{t['objects']} object(s)" if "objects" in t else ""
        if t["status"] in ("failed", "started"):
            what = f"log {t['log']}"
        lines.append(f"  shard {t['index']:<3} {t['status']:<8} {what}".rstrip())
    link = doc["link"]
    lines.append(f"  link      {link['status']:<8} " + (f"wheel {link['wheel']}" if link.get("wheel") else
                                                         f"log {link['log']}"))
    return lines


def outcome(doc: Mapping[str, Any]) -> PorterError | None:
    """None while the build runs or once it shipped a wheel; CheckFailed when a shard or the link failed."""
    if doc["state"] != "failed":
        return None
    if failed := [t for t in doc["tasks"] if t["status"] == "failed"]:
        return CheckFailed(f"{len(failed)} shard(s) failed: " + ", ".join(str(t["index"]) for t in failed)
                           + "; the link job was cancelled (afterok)",
                           hint=f"read {failed[0]['log']}; fix the cause and submit again (objects already "
                                "compiled are kept)")
    return CheckFailed(f"the link job failed (exit code {doc['link']['exit_code']})",
                       hint=f"read {doc['link']['log']}")


# --------------------------------------------------------------------------------------------- submission

@dataclass
class ShardRun:
    request: ShardRequest
    submission: dict[str, Any] | None = None
    status: dict[str, Any] | None = None
    """After --wait: the build's status (the link job's wheel)."""
    dry_run: list[str] | None = None

    def to_dict(self) -> dict[str, Any]:
        req = self.request
        doc: dict[str, Any] = {"mode": "slurm", "dry_run": self.dry_run is not None, "shards": req.shards,
                               "dir": str(req.dir), "build_dir": str(req.build_dir), "cache": str(req.cache),
                               "compile_steps": req.compile_steps, "wheelhouse": str(req.wheelhouse),
                               "scripts": {"shard": str(req.folder.task_script), "link": str(req.folder.final_script)},
                               "status_command": f"porter ops status {req.dir}"}
        if self.dry_run is not None:
            doc["lines"] = self.dry_run
        if self.submission is not None:
            doc.update(array_job=self.submission["array_job"], link_job=self.submission["link_job"],
                       submission=self.submission)
        if self.status is not None:
            doc.update(status=self.status, wheel=self.status["link"].get("wheel"))
        return doc


def preflight(req: ShardRequest) -> list[str]:
    """Refuse folders the jobs could not write, before anything is written or submitted. Returns warnings."""
    ensure_writable_dir(req.dir, what="shards folder", option="--dir")
    ensure_writable_dir(req.wheelhouse, what="wheelhouse", option="-o")
    ensure_writable_dir(req.cache, what="porter cache (the shared build folder)", option="PORTER_CACHE_DIR=")
    warnings = sl.local_disk_warnings({"shards folder": req.dir, "porter cache": req.cache,
                                       "wheelhouse": req.wheelhouse, "python": req.python})
    return warnings + req.folder.still_running_warning(read_exit_code(req.link_exit) is not None)


def _dry_run_lines(req: ShardRequest, settings: sl.SlurmSettings, programs: sl.Programs | None,
                   refusal: str | None) -> list[str]:
    last = "one link job; the wheel into" if not req.build.reports else \
        "one job that reports every unit; its report beside"
    lines = [f"# {req.shards} shard(s) of {req.compile_steps} compile step(s) into {req.build_dir}, "
             f"then {last} {req.wheelhouse}",
             f"# folder {req.dir} (scripts, results, logs); porter cache {req.cache}"]
    for path, text in scripts(req).items():
        lines.append(f"# --- {path}")
        lines += text.rstrip("\n").splitlines()
    return lines + req.folder.dry_run_tail(name=req.name, tasks=req.shards, settings=settings, programs=programs,
                                           refusal=refusal)


def submit_build(req: ShardRequest, planner: Callable[[], BuildFacts], *, settings: sl.SlurmSettings,
                 runner: Runner, env: Mapping[str, str], dir_given: bool = True,
                 wait: bool = False, log: Logger | None = None, poll: float = 0.5) -> ShardRun:
    """``porter ops build --shards N --slurm``: find sbatch, check the folders, read the build's plan
    (``planner``: a dry run of the same build), write the folder, submit the held array and the link job
    (afterok), release; with ``wait``, until the link job recorded its exit code. ``dir_given`` False:
    ``req.dir`` becomes ``shards/<the build's key>`` in the cache. A dry run (a recording ``runner``) describes it
    all and ends with what a real run here would refuse."""
    log = log or quiet_logger()
    dry_run = runner.dry
    programs, refusal = sl.programs_or_refusal(env, runner, what="the shards", local=LOCAL)
    if not dry_run:  # before the planner writes anything (it unpacks the source into the cache)
        ensure_writable_dir(req.cache, what="porter cache (the shared build folder)", option="PORTER_CACHE_DIR=")
        ensure_writable_dir(req.wheelhouse, what="wheelhouse", option="-o")
        if dir_given:
            ensure_writable_dir(req.dir, what="shards folder", option="--dir")
    facts = planner()
    req = req.with_facts(facts, dir_given=dir_given)
    if facts.compile_steps == 0:
        raise ConfigError("the build's plan has no compile step to shard", hint="check --ops and the toolchain")
    if req.shards > facts.compile_steps:
        raise ConfigError(f"{req.shards} shards for {facts.compile_steps} compile step(s): some shards would "
                          "compile nothing", hint=f"pass --shards {facts.compile_steps} or fewer")
    if dry_run:
        try:
            preflight(req)
        except ConfigError as exc:
            refusal = refusal or exc.message
        return ShardRun(req, dry_run=_dry_run_lines(req, settings, programs, facts.refusal or refusal))
    if facts.refusal:
        raise CheckFailed(f"the build would be refused: {facts.refusal}",
                          hint="fix it before submitting; nothing was submitted")
    assert programs is not None
    for w in preflight(req):
        log.warn(w)
    write_jobs(req)
    sub = req.folder.submit(
        name=req.name, tasks=req.shards, settings=settings, programs=programs, runner=runner, env=env,
        hint="check --partition, --account and the limits (--time, --mem, --cpus-per-task)")
    log.info(f"submitted {req.shards} shard(s) as array job {sub['array_job']} and link job {sub['link_job']} "
             f"(afterok:{sub['array_job']}); the wheel will land in {req.wheelhouse}")
    if wait:
        req.folder.wait(req.link_exit, sub, programs=programs, runner=runner, env=env, log=log, poll=poll,
                        lost_hint=f"a shard failed or was lost, so afterok:{sub['array_job']} never held; read "
                                  f"'porter ops status {req.dir}' and the logs in {req.dir / 'logs'}")
    return ShardRun(req, submission=sub, status=status(req.dir) if wait else None)
