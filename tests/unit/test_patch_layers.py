"""Layered sets: two sets on one file (deepspeed/no-jit, then deepspeed/explicit-arch on op_builder/builder.py).

The journal knows their order per file; status tells each set's state truly; reverting the lower set
re-applies the upper one (or refuses, naming it, when it cannot); a second apply is "nothing to do" (exit 4);
check says "would apply" until a set is applied.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from porter.cli import cli
from porter.errors import CheckFailed, NothingToDo
from porter.patching import apply, checked, plan, plan_revert, read_journal, resolve_sets, revert
from porter.patching.engine import journal_status
from porter.patching.model import load_file

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "patch"
BUILDER = "op_builder/builder.py"
BOTH = ("op_builder/builder.py", "deepspeed/ops/op_builder/builder.py")


def snapshot(root: Path, *, journal: bool = True) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()
            and (journal or not p.relative_to(root).as_posix().startswith(".porter"))}


@pytest.fixture
def ds(tmp_path: Path) -> Path:
    dest = tmp_path / "ds"
    shutil.copytree(FIXTURES / "deepspeed", dest)
    return dest


def copy(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


def run(*args: str) -> tuple[int, str, str, BaseException | None]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr, result.exception


def layered(ds: Path, *, one_call: bool) -> None:
    if one_call:
        apply(ds, resolve_sets("deepspeed/no-jit") + resolve_sets("deepspeed/explicit-arch"))
    else:
        apply(ds, resolve_sets("deepspeed/no-jit"))
        apply(ds, resolve_sets("deepspeed/explicit-arch"))


# ---------------------------------------------------------------------------------------------
# the journal and status

@pytest.mark.parametrize("one_call", [True, False])
def test_journal_orders_the_sets_on_a_file(ds: Path, one_call: bool) -> None:
    layered(ds, one_call=one_call)
    entries = {e["set"]: {f["path"]: f for f in e["files"]} for e in read_journal(ds)["sets"]}
    low, high = entries["deepspeed/no-jit"][BUILDER], entries["deepspeed/explicit-arch"][BUILDER]
    assert low["seq"] < high["seq"]
    assert high["before"] == low["after"]  # explicit-arch was applied on what no-jit left


@pytest.mark.parametrize("one_call", [True, False])
def test_status_is_true_for_each_layer(ds: Path, one_call: bool) -> None:
    layered(ds, one_call=one_call)
    rows = {s.set: s for s in journal_status(ds)}
    assert rows["deepspeed/no-jit"].state == "applied"
    assert rows["deepspeed/explicit-arch"].state == "applied"
    low = {f.path: f for f in rows["deepspeed/no-jit"].files}[BUILDER]
    assert (low.state, low.above, low.below) == ("ok", ("deepspeed/explicit-arch",), ())
    high = {f.path: f for f in rows["deepspeed/explicit-arch"].files}[BUILDER]
    assert (high.state, high.above, high.below) == ("ok", (), ("deepspeed/no-jit",))

    code, out, _, exc = run("patch", "status", str(ds))
    assert code == 0, exc
    assert "CHANGED" not in out
    assert "deepspeed/no-jit (version 0.19.8" in out and "): applied" in out
    assert f"  ok      {BUILDER}  (then deepspeed/explicit-arch)" in out


def test_status_names_a_change_made_after_porter(ds: Path) -> None:
    layered(ds, one_call=False)
    f = ds / BUILDER
    f.write_text(f.read_text() + "# my own edit\n")
    rows = {s.set: s for s in journal_status(ds)}
    for ref in ("deepspeed/no-jit", "deepspeed/explicit-arch"):
        assert rows[ref].state == "changed"
        state = {x.path: x for x in rows[ref].files}[BUILDER]
        assert (state.state, state.detail) == ("changed", "edited since deepspeed/explicit-arch was applied")
    other = {x.path: x for x in rows["deepspeed/no-jit"].files}["deepspeed/ops/op_builder/builder.py"]
    assert other.state == "ok"
    code, out, _, _ = run("patch", "status", str(ds), "--json")
    doc = json.loads(out)
    assert [s["state"] for s in doc["sets"]] == ["changed", "changed"]


def test_status_names_an_edit_between_the_layers(ds: Path) -> None:
    apply(ds, resolve_sets("deepspeed/no-jit"))
    f = ds / BUILDER
    f.write_text(f.read_text() + "# edited between the sets\n")
    apply(ds, resolve_sets("deepspeed/explicit-arch"))
    rows = {s.set: {x.path: x for x in s.files} for s in journal_status(ds)}
    assert rows["deepspeed/explicit-arch"][BUILDER].state == "ok"
    low = rows["deepspeed/no-jit"][BUILDER]
    assert low.state == "changed"
    assert low.detail == "edited after deepspeed/no-jit was applied and before deepspeed/explicit-arch was"


# ---------------------------------------------------------------------------------------------
# apply / check: nothing to do is exit 4, check tells "would apply" from "applied"

def test_lower_set_is_still_applied_under_the_upper_one(ds: Path) -> None:
    layered(ds, one_call=False)
    p = plan(ds, resolve_sets("deepspeed"))
    assert [(s.ref, s.state, s.journaled) for s in p.sets] == [("deepspeed/no-jit", "applied", True),
                                                               ("deepspeed/explicit-arch", "applied", True)]
    assert apply(ds, resolve_sets("deepspeed/no-jit")).changed == ()


def test_second_apply_exits_4(ds: Path) -> None:
    argv = ["-q", "patch", "apply", str(ds), "--set", "deepspeed/no-jit", "--set", "deepspeed/explicit-arch"]
    code, out, _, exc = run(*argv)
    assert code == 0, exc
    assert "patched op_builder/builder.py" in out
    after = snapshot(ds)
    code, out, _, exc = run(*argv)
    assert isinstance(exc, NothingToDo) and exc.exit_code == 4
    assert "deepspeed/no-jit: applied; deepspeed/explicit-arch: applied" in exc.message
    assert snapshot(ds) == after
    code, _, _, exc = run(*argv, "--json")
    assert isinstance(exc, NothingToDo)


def test_apply_with_nothing_needed_exits_4(ds: Path) -> None:
    for f in BOTH:
        (ds / f).write_text("from abc import ABC\n\n\nclass OpBuilder(ABC):\n    pass\n")
    _, _, _, exc = run("-q", "patch", "apply", str(ds), "--set", "deepspeed/no-jit")
    assert isinstance(exc, NothingToDo) and "deepspeed/no-jit: not needed" in exc.message
    assert not (ds / ".porter").exists()


def test_check_says_would_apply_then_applied(ds: Path) -> None:
    code, out, _, exc = run("-q", "patch", "check", str(ds), "--set", "deepspeed/no-jit")
    assert code == 0, exc
    assert out.splitlines()[0] == "deepspeed/no-jit (version 0.19.8): would apply"
    assert "would apply" in out.splitlines()[1] and ": applied" not in out
    apply(ds, resolve_sets("deepspeed/no-jit"))
    code, out, _, _ = run("-q", "patch", "check", str(ds), "--set", "deepspeed/no-jit", "--set",
                          "deepspeed/explicit-arch")
    assert code == 0
    assert "deepspeed/no-jit (version 0.19.8): applied" in out
    assert "deepspeed/explicit-arch (version 0.19.8): would apply" in out
    code, out, _, _ = run("patch", "check", str(ds), "--set", "deepspeed", "--json")
    assert [s["state"] for s in json.loads(out)["sets"]] == ["applied", "would apply"]


def test_apply_results_say_applied_only_once_written(ds: Path) -> None:
    dry = checked(ds, resolve_sets("deepspeed/no-jit"))
    assert {r.status for r in dry.sets[0].results} == {"would-apply"}
    done = apply(ds, resolve_sets("deepspeed/no-jit"))
    assert {r.status for r in done.plan.sets[0].results} == {"applied"}
    assert done.plan.sets[0].results[0].to_dict()["status"] == "applied"


# ---------------------------------------------------------------------------------------------
# revert of the lower set

@pytest.mark.parametrize("one_call", [True, False])
def test_revert_lower_set_reapplies_the_upper(ds: Path, tmp_path: Path, one_call: bool) -> None:
    original = snapshot(ds)
    only_arch = copy(ds, tmp_path / "only-arch")
    apply(only_arch, resolve_sets("deepspeed/explicit-arch"))
    layered(ds, one_call=one_call)

    done = revert(ds, ["deepspeed/no-jit"])
    assert done.sets == ("deepspeed/no-jit",) and done.reapplied == ("deepspeed/explicit-arch",)
    # byte-identical to a tree that only ever had explicit-arch
    assert snapshot(ds, journal=False) == snapshot(only_arch, journal=False)
    (entry,) = read_journal(ds)["sets"]
    assert entry["set"] == "deepspeed/explicit-arch"
    rec = {f["path"]: f for f in entry["files"]}[BUILDER]
    assert rec["before"] == original[BUILDER]
    assert (ds / rec["backup"]).read_bytes() == (FIXTURES / "deepspeed" / BUILDER).read_bytes()
    assert not (ds / ".porter/originals/deepspeed_no-jit").exists()
    assert [s.state for s in journal_status(ds)] == ["applied"]

    revert(ds)
    assert snapshot(ds) == original


def test_revert_lower_set_dry_run_shows_the_result(ds: Path) -> None:
    layered(ds, one_call=False)
    before = snapshot(ds)
    done = plan_revert(ds, ["deepspeed/no-jit"])
    assert snapshot(ds) == before
    assert done.reapplied == ("deepspeed/explicit-arch",)
    changed = [line for line in done.diff().splitlines()
               if line.startswith(("-", "+")) and not line.startswith(("---", "+++"))]
    assert "-        _porter_refuse_jit(self.name)" in changed
    assert not any("_porter_rocm" in line or "_porter_no_wavefront" in line for line in changed)


def test_revert_refuses_naming_an_upper_set_it_cannot_load(ds: Path) -> None:
    layered(ds, one_call=False)
    before = snapshot(ds)
    with pytest.raises(CheckFailed) as err:
        revert(ds, ["deepspeed/no-jit"], load_set=lambda entry: None)
    assert "cannot revert deepspeed/no-jit alone: deepspeed/explicit-arch was applied on top of it" in \
        err.value.message
    assert "--set deepspeed/explicit-arch" in (err.value.hint or "")
    assert snapshot(ds) == before


def test_revert_refuses_naming_an_upper_set_that_needs_the_lower(ds: Path, tmp_path: Path) -> None:
    apply(ds, resolve_sets("deepspeed/no-jit"))
    upper = tmp_path / "on-top.toml"
    upper.write_text('''[set]
description = "anchors on a line no-jit inserted"
[[patch]]
id = "log-refusals"
why = "x"
files = ["op_builder/builder.py"]
[[patch.edit]]
action = "insert_after"
anchor = "def _porter_refuse_jit(op_name):"
text = "    print(op_name)"
''')
    apply(ds, [load_file(upper)])
    before = snapshot(ds)
    with pytest.raises(CheckFailed) as err:
        revert(ds, ["deepspeed/no-jit"])
    msg = err.value.message
    assert "cannot revert deepspeed/no-jit alone: local/on-top, applied on top of it on op_builder/builder.py, " \
           "does not apply without it" in msg
    assert "anchor not found" in msg and "def _porter_refuse_jit(op_name):" in msg
    assert snapshot(ds) == before
    done = revert(ds, ["deepspeed/no-jit", "local/on-top"])  # both: a plain restore
    assert done.reapplied == ()
    assert not (ds / ".porter").exists()


def test_revert_lower_refuses_over_later_edits_unless_forced(ds: Path, tmp_path: Path) -> None:
    only_arch = copy(ds, tmp_path / "only-arch")
    apply(only_arch, resolve_sets("deepspeed/explicit-arch"))
    layered(ds, one_call=False)
    f = ds / BUILDER
    f.write_text(f.read_text() + "# mine\n")
    with pytest.raises(CheckFailed, match=f"{BUILDER} changed since deepspeed/explicit-arch was applied"):
        revert(ds, ["deepspeed/no-jit"])
    done = revert(ds, ["deepspeed/no-jit"], force=True)
    assert done.forced == (BUILDER,)
    assert f.read_bytes() == (only_arch / BUILDER).read_bytes()


def test_lower_set_cannot_change_a_file_again_under_the_upper(ds: Path) -> None:
    layered(ds, one_call=False)
    f = ds / BUILDER
    f.write_text(f.read_text().replace("        _porter_refuse_jit(self.name)\n", ""))  # undo no-jit by hand
    before = snapshot(ds)
    with pytest.raises(CheckFailed, match="deepspeed/no-jit would change op_builder/builder.py again, but "
                                          "deepspeed/explicit-arch was applied on top of it there"):
        apply(ds, resolve_sets("deepspeed/no-jit"))
    assert snapshot(ds) == before


def test_cli_revert_lower_reports_reapplied(ds: Path) -> None:
    layered(ds, one_call=False)
    code, out, _, exc = run("patch", "revert", str(ds), "--set", "deepspeed/no-jit", "--json")
    assert code == 0, exc
    doc = json.loads(out)
    assert doc["reverted"] == ["deepspeed/no-jit"] and doc["reapplied"] == ["deepspeed/explicit-arch"]
    code, out, _, _ = run("patch", "status", str(ds), "--json")
    assert [(s["set"], s["state"]) for s in json.loads(out)["sets"]] == [("deepspeed/explicit-arch", "applied")]


def test_journal_without_seq_keeps_entry_order(ds: Path) -> None:
    layered(ds, one_call=False)
    path = ds / ".porter" / "patches.json"
    doc = json.loads(path.read_text())
    for entry in doc["sets"]:
        for rec in entry["files"]:
            del rec["seq"]
    path.write_text(json.dumps(doc))
    assert [s.state for s in journal_status(ds)] == ["applied", "applied"]
    assert revert(ds, ["deepspeed/no-jit"]).reapplied == ("deepspeed/explicit-arch",)
