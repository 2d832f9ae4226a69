"""The example CI workflow (examples/ci/distperf.yml, issue 46) does what its comments say:
which jobs each event runs (read from the file by tests/actions_model.py), the options it
passes exist, its GPU variant cannot fall back to the CPU, and its scripts and steps, run with
bash in a scratch git repository whose origin is a bare repository, from the first push to
main to a re-save on a pull request, with real pytest runs on 2 gloo ranks."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from actions_model import (
    Event,
    context,
    dispatch,
    evaluate,
    jobs_run,
    load,
    pull_request,
    push,
    run_job,
    starts,
)
from quick_runs import NO_DYNAMO, quick_env

from pytest_distperf import plugin
from pytest_distperf.records import TestRecord, Verdict
from pytest_distperf.report import jsonreport
from pytest_distperf.report.export import FORMATS, bigger_path

ROOT = Path(__file__).resolve().parents[1]
CI = ROOT / "examples" / "ci"
WORKFLOW = load(CI / "distperf.yml")
LABEL = "distperf-resave"


class _Options:
    """Stands in for pytest's parser and its option group: keeps the flags the plugin adds."""

    def __init__(self) -> None:
        self.flags: set[str] = set()

    def getgroup(self, *args: Any, **kwargs: Any) -> _Options:
        return self

    def addoption(self, *names: str, **kwargs: Any) -> None:
        self.flags.update(names)

    def addini(self, *args: Any, **kwargs: Any) -> None:
        pass


def plugin_flags() -> set[str]:
    options = _Options()
    plugin.pytest_addoption(options)  # type: ignore[arg-type]
    return options.flags


# -- the model the tests below read the workflow with ---------------------------------------------
@pytest.mark.parametrize(("expression", "value"), [
    ("github.event_name == 'push'", True),
    ("${{ github.event_name != 'push' }}", False),
    ("!cancelled() && github.event.label.name == 'x'", False),
    ("github.event.nothing.here == null", True),
    ("(false || github.ref_name == 'main') && !(github.head_ref != '')", True),
    ("secrets.DISTPERF_TOKEN || github.token", "ghs_token"),
    ("contains('it''s', 'T''S')", True),
])
def test_the_model_reads_expressions_as_github_does(expression: str, value: Any) -> None:
    assert evaluate(expression, context(push("main"))) == value


@pytest.mark.parametrize(("changed", "runs"), [
    (("perf_baselines/a.toml", "perf_baselines/sub/b.toml"), False),
    (("perf_baselines/a.toml", "README.md"), True),
    (("perf_baselinesX/a.toml",), True),
])
def test_the_model_applies_paths_ignore(changed: tuple[str, ...], runs: bool) -> None:
    assert starts(WORKFLOW, push("main", changed)) is runs


# -- which jobs each event runs --------------------------------------------------------------------
EVENTS = [
    ("a push to main", push("main"), ["baselines", "history"]),
    ("a baseline commit merged to main", push("main", ("perf_baselines/test_x.toml",)), []),
    ("baselines merged with code", push("main", ("perf_baselines/x.toml", "src/m.py")),
     ["baselines", "history"]),
    ("the baseline branch pushed", push("distperf/baselines"), []),
    ("a pull request opened", pull_request("opened"), ["compare"]),
    ("new commits on it", pull_request("synchronize"), ["compare"]),
    ("reopened", pull_request("reopened"), ["compare"]),
    ("closed", pull_request("closed"), []),
    ("labelled to re-save", pull_request("labeled", LABEL), ["resave"]),
    ("labelled otherwise", pull_request("labeled", "bug"), []),
    ("a fork's, labelled to re-save", pull_request("labeled", LABEL, fork=True), []),
    ("Run workflow on main", dispatch("main"), ["baselines"]),
    ("Run workflow on a branch", dispatch("feature"), ["resave"]),
]


@pytest.mark.parametrize(("event", "jobs"), [e[1:] for e in EVENTS], ids=[e[0] for e in EVENTS])
def test_each_event_runs_the_jobs_the_comments_promise(event: Event, jobs: list[str]) -> None:
    assert jobs_run(WORKFLOW, event) == jobs


def test_the_resave_removes_the_label_it_answers_to() -> None:
    job = WORKFLOW["jobs"]["resave"]
    (remove,) = [s for s in job["steps"] if "removeLabel" in s.get("with", {}).get("script", "")]
    assert f"github.event.label.name == '{LABEL}'" in job["if"]
    assert f'name: "{LABEL}"' in remove["with"]["script"] and "always()" in remove["if"]


def test_every_job_that_runs_the_suite_installs_it_and_runs_on_one_kind_of_runner() -> None:
    suite = {name: job for name, job in WORKFLOW["jobs"].items()
             if any("pytest" in step.get("run", "") for step in job["steps"])}
    assert sorted(suite) == ["baselines", "compare", "resave"]
    assert len({str(job["runs-on"]) for job in suite.values()}) == 1
    for job in suite.values():
        runs = [step.get("run", "") for step in job["steps"]]
        assert 'bash "$DISTPERF_CI/install.sh"' in runs
        saves = [r for r in runs if "--distperf-save" in r]
        assert all("$DISTPERF_ARGS" in r for r in runs if "pytest " in r)
        # a comparison takes the strict choice; a save compares nothing
        assert all("$DISTPERF_STRICT" in r for r in runs if "pytest " in r and r not in saves)


# -- the options it passes -----------------------------------------------------------------------
def _text(variant: str) -> str:
    return (CI / "distperf.yml").read_text() if variant == "cpu" else gpu_variant()


def gpu_variant() -> str:
    """The workflow with each line marked ``# GPU: <value>`` set to that value."""
    text = (CI / "distperf.yml").read_text()
    return re.sub(r"^(\s*[\w-]+: ).*?\s+# GPU: (.+)$", r"\1\2", text, flags=re.M)


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
def test_the_recipe_passes_only_options_the_plugin_has(variant: str) -> None:
    text = _text(variant)
    used = set(re.findall(r"--distperf[a-z-]*|--gpus\b", text))
    assert {"--distperf", "--distperf-save", "--distperf-json", "--distperf-export",
            "--distperf-strict", "--distperf-env-name"} <= used
    assert used <= plugin_flags(), used - plugin_flags()
    exports = re.findall(r"--distperf-export\s+(\S+)\s+(\S+)", text)
    assert {fmt for fmt, _ in exports} == {"bmf", "gab"} <= set(FORMATS)
    # github-action-benchmark reads the gab files, each in its own direction, under a name
    # of its own (one history per name), and pushes to gh-pages only on main
    gab = {path for fmt, path in exports if fmt == "gab"}
    files = {"customSmallerIsBetter": gab,
             "customBiggerIsBetter": {str(bigger_path(Path(p))) for p in gab}}
    steps = [(job, s) for job, spec in WORKFLOW["jobs"].items() for s in spec["steps"]
             if "github-action-benchmark" in s.get("uses", "")]
    assert len(steps) == 4
    names = set()
    for job, step in steps:
        assert step["with"]["output-file-path"] in files[step["with"]["tool"]], step
        assert f"hashFiles('{step['with']['output-file-path']}') != ''" in step["if"], step
        names.add((step["with"]["name"], step["with"]["tool"]))
        assert step["with"]["auto-push"] is (job == "history"), step
    assert len(names) == 2 and len({n for n, _ in names}) == 2
    # the steps after a comparison that may fail still run
    compare = WORKFLOW["jobs"]["compare"]["steps"]
    after = compare[[s.get("name") for s in compare].index("Compare with the baselines") + 1:]
    assert after and all("!cancelled()" in s["if"] for s in after)


def test_the_gpu_variant_runs_nccl_on_a_gpu_runner_or_fails() -> None:
    cpu, gpu = (CI / "distperf.yml").read_text(), gpu_variant()
    changed = [(a, b) for a, b in zip(cpu.splitlines(), gpu.splitlines(), strict=True)
               if a != b]
    assert len(changed) == 5, changed  # torch, the options, three jobs' runners
    variant = yaml.safe_load(gpu)
    assert variant["env"]["TORCH_INDEX"].startswith("https://download.pytorch.org/whl/cu")
    args = variant["env"]["DISTPERF_ARGS"].split()
    assert args[args.index("--distperf-backend") + 1] == "nccl"  # never gloo on the CPU
    assert "--distperf-env-name" in args
    for name in ("compare", "baselines", "resave"):
        assert variant["jobs"][name]["runs-on"] == ["self-hosted", "gpu"]


# -- the scripts ---------------------------------------------------------------------------------
def _git_env(tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "gitconfig"
    config.write_text("[user]\n\tname = dev\n\temail = dev@example.com\n")
    return {"GIT_CONFIG_GLOBAL": str(config), "GIT_CONFIG_NOSYSTEM": "1"}


def git(cwd: Path, *args: str, env: dict[str, str]) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, env={**os.environ, **env}, check=True,
                          capture_output=True, text=True)
    return proc.stdout.strip()


def scratch(tmp_path: Path, files: dict[str, str]) -> tuple[Path, Path, dict[str, str]]:
    """A clone (``work``) of a bare repository (``origin.git``) whose main holds ``files``."""
    env = _git_env(tmp_path)
    origin, work = tmp_path / "origin.git", tmp_path / "work"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(origin), env=env)
    git(tmp_path, "init", "-q", "-b", "main", str(work), env=env)
    git(work, "remote", "add", "origin", str(origin), env=env)
    for name, text in files.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(text)
    git(work, "add", ".", env=env)
    git(work, "commit", "-q", "-m", "start", env=env)
    git(work, "push", "-q", "origin", "main", env=env)
    return origin, work, env


def _changed(repo: Path, commit: str, env: dict[str, str]) -> list[str]:
    return git(repo, "show", "--format=", "--name-only", commit, env=env).splitlines()


def _script(name: str, cwd: Path, *args: str,
            env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    runner = [sys.executable] if name.endswith(".py") else ["bash"]
    return subprocess.run([*runner, str(CI / name), *args], cwd=cwd, env={**os.environ, **env},
                          capture_output=True, text=True, check=False, timeout=60)


def test_the_resave_commits_the_baselines_alone_to_the_branch(tmp_path: Path) -> None:
    origin, work, env = scratch(tmp_path, {"src/model.py": "x = 1\n",
                                           "perf_baselines/test_x.toml": "old\n"})
    git(work, "checkout", "-q", "-b", "feature", env=env)
    (work / "src/model.py").write_text("x = 2\n")
    git(work, "commit", "-qam", "an intended slowdown", env=env)
    git(work, "push", "-q", "origin", "feature", env=env)
    head = git(work, "rev-parse", "HEAD", env=env)
    # what the save left: new baselines, the run's reports beside them, and other changes
    (work / "perf_baselines/test_x.toml").write_text("new\n")
    (work / "perf_baselines/test_y.toml").write_text("new\n")
    (work / "distperf").mkdir()
    (work / "distperf/report.json").write_text("{}")
    (work / "src/model.py").write_text("x = 3\n")
    (work / "src/staged.py").write_text("y = 1\n")
    git(work, "add", "src/staged.py", env=env)
    done = _script("commit-baselines.sh", work, "feature", "perf_baselines: re-saved", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "distperf: pushed " in done.stdout
    pushed = git(origin, "rev-parse", "feature", env=env)
    assert git(origin, "rev-parse", f"{pushed}^", env=env) == head
    changed = _changed(origin, pushed, env)
    assert changed == ["perf_baselines/test_x.toml", "perf_baselines/test_y.toml"]
    assert git(origin, "log", "-1", "--format=%an|%s", pushed, env=env) == (
        "github-actions[bot]|perf_baselines: re-saved")
    # what that commit starts: compare on the pull request (pushed with a token that starts
    # runs), no save; merged alone, nothing
    assert jobs_run(WORKFLOW, pull_request("synchronize")) == ["compare"]
    assert jobs_run(WORKFLOW, push("feature", tuple(changed))) == []
    assert jobs_run(WORKFLOW, push("main", tuple(changed))) == []
    # nothing new: no commit
    again = _script("commit-baselines.sh", work, "feature", "again", env=env)
    assert again.returncode == 0 and "unchanged: nothing to commit" in again.stdout
    assert git(origin, "rev-parse", "feature", env=env) == pushed


def test_the_resave_fails_when_the_branch_moved_meanwhile(tmp_path: Path) -> None:
    origin, work, env = scratch(tmp_path, {"perf_baselines/test_x.toml": "old\n"})
    other = tmp_path / "other"
    git(tmp_path, "clone", "-q", str(origin), str(other), env=env)
    (other / "more.py").write_text("y = 1\n")
    git(other, "add", "more.py", env=env)
    git(other, "commit", "-qm", "pushed during the save", env=env)
    git(other, "push", "-q", "origin", "main", env=env)
    (work / "perf_baselines/test_x.toml").write_text("new\n")
    done = _script("commit-baselines.sh", work, "main", "re-saved", env=env)
    assert done.returncode == 1
    assert "::error::could not push the saved baselines to main" in done.stdout
    assert "label the pull request again" in done.stdout


def test_a_save_that_wrote_nothing_commits_nothing(tmp_path: Path) -> None:
    _, work, env = scratch(tmp_path, {"src/model.py": "x = 1\n"})
    done = _script("commit-baselines.sh", work, "main", "m", env=env)
    assert done.returncode == 0 and "no perf_baselines/ folder" in done.stdout


def test_the_history_branch_is_created_once(tmp_path: Path) -> None:
    origin, work, env = scratch(tmp_path, {"src/model.py": "x = 1\n"})
    first = _script("create-gh-pages.sh", work, env=env)
    assert first.returncode == 0 and "created the gh-pages branch" in first.stdout
    commit = git(origin, "rev-parse", "gh-pages", env=env)
    assert git(origin, "ls-tree", commit, env=env) == ""  # one empty commit
    second = _script("create-gh-pages.sh", work, env=env)
    assert second.returncode == 0 and second.stdout == ""
    assert git(origin, "rev-parse", "gh-pages", env=env) == commit


def _fake_python(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A ``python`` on PATH that logs its arguments instead of installing anything."""
    folder, log = tmp_path / "bin", tmp_path / "calls.log"
    folder.mkdir()
    (folder / "python").write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    (folder / "python").chmod(0o755)
    log.write_text("")
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}, log


def test_the_install_refuses_the_placeholder_and_installs_torch_first(tmp_path: Path) -> None:
    path, log = _fake_python(tmp_path)
    env = {**WORKFLOW["env"], **path}
    refused = _script("install.sh", tmp_path, env=env)
    assert refused.returncode == 1 and log.read_text() == ""
    assert refused.stdout.startswith("::error::DISTPERF_PACKAGE has a placeholder left: "
                                     f"'{WORKFLOW['env']['DISTPERF_PACKAGE']}'")
    package = "pytest-distperf[plot] @ git+https://github.com/o/pytest-distperf@v0.1.0"
    done = _script("install.sh", tmp_path, env={**env, "DISTPERF_PACKAGE": package})
    assert done.returncode == 0, done.stdout + done.stderr
    assert log.read_text().splitlines() == [
        f"-m pip install torch --index-url {WORKFLOW['env']['TORCH_INDEX']}",
        f"-m pip install {package}"]


def _report(tmp_path: Path, tests: dict[str, tuple[str, ...]]) -> Path:
    """A JSON report as the plugin writes it, with one verdict of each given kind a test."""
    records = [TestRecord(nodeid, 2, verdicts=[Verdict(f"m{i}", kind, "gloo-cpu-w2", "s")
                                               for i, kind in enumerate(kinds)])
               for nodeid, kinds in tests.items()]
    path = tmp_path / "report.json"
    path.write_text(jsonreport.dumps(jsonreport.document(records, header="distperf")))
    return path


@pytest.mark.parametrize(("tests", "listed"), [
    ({"t.py::a": ("unchanged",), "t.py::b": ("improved", "informational")}, []),
    ({"t.py::a": ("no baseline",), "t.py::b": ("unchanged",)}, ["t.py::a"]),  # a new test
    ({"t.py::a": ("unchanged", "no baseline")}, ["t.py::a"]),                 # a new metric
    ({"t.py::a": ("not comparable",), "t.py::b[x-1]": ("no baseline",)},      # a new key
     ["t.py::a", "t.py::b[x-1]"]),
    ({"t.py::a": ("regressed", "no baseline")}, []),  # saving it would hide the regression
    ({"t.py::a": ("saved",)}, []),
    ({}, []),
])
def test_main_saves_only_the_tests_that_compared_nothing(
        tmp_path: Path, tests: dict[str, tuple[str, ...]], listed: list[str]) -> None:
    done = _script("tests-to-save.py", tmp_path, str(_report(tmp_path, tests)), env={})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == listed
    assert ("not saving t.py::a: it regressed" in done.stderr) is (
        "regressed" in tests.get("t.py::a", ()))


def test_no_report_is_an_error_that_says_why(tmp_path: Path) -> None:
    done = _script("tests-to-save.py", tmp_path, "distperf/report.json", env={})
    assert done.returncode == 1 and done.stdout == ""
    assert "cannot read the distperf report distperf/report.json" in done.stderr


# -- the steps of "baselines", judged with a report in place of the run --------------------------
@pytest.mark.parametrize(("event", "tests", "saved"), [
    (push("main"), {"t.py::a": ("unchanged",)}, []),                  # every push after
    (push("main"), {"t.py::a": ("unchanged",), "t.py::b": ("no baseline",)}, ["t.py::b"]),
    (dispatch("main"), {"t.py::a": ("unchanged",)}, ["tests/perf"]),  # on request: all
])
def test_main_proposes_baselines_only_when_it_saved_some(
        tmp_path: Path, event: Event, tests: dict[str, tuple[str, ...]],
        saved: list[str]) -> None:
    (tmp_path / "distperf").mkdir()
    _report(tmp_path / "distperf", tests)
    pretend = {"Install": 0, "Compare main with its baselines": 0,
               "Save them on this runner": 0}
    steps = run_job(WORKFLOW, "baselines", event, tmp_path, {"DISTPERF_CI": str(CI)}, pretend)
    assert steps["Compare main with its baselines"].ran is (event.name == "push")
    assert steps["Which tests to save"].outputs == {"count": str(len(saved))}
    assert (tmp_path / "distperf/to-save.txt").read_text().splitlines() == saved
    assert steps["Save them on this runner"].ran is bool(saved)
    assert steps["Propose the baselines"].ran is bool(saved)


def test_a_regression_on_main_keeps_no_other_test_from_its_first_baseline(
        tmp_path: Path) -> None:
    (tmp_path / "distperf").mkdir()
    _report(tmp_path / "distperf", {"t.py::a": ("regressed",), "t.py::b": ("no baseline",)})
    pretend = {"Install": 0, "Compare main with its baselines": 1,
               "Save them on this runner": 0}
    steps = run_job(WORKFLOW, "baselines", push("main"), tmp_path, {"DISTPERF_CI": str(CI)},
                    pretend)
    assert (tmp_path / "distperf/to-save.txt").read_text().splitlines() == ["t.py::b"]
    assert steps["Save them on this runner"].ran and steps["Keep the reports"].ran
    assert steps["Propose the baselines"].ran


# -- end to end: the first run, the baseline pull request, a re-save, a comparison ---------------
PERF = textwrap.dedent("""
    import time

    import pytest

    pytestmark = pytest.mark.distperf(tolerance=1.0)  # a sleep: only the flow is under test
    SLEEP = {sleep}


    def test_a(nccl_group):
        nccl_group.measure("a", time.sleep, SLEEP, iters=5, warmup=0, control=False)


    def test_b(nccl_group):
        nccl_group.measure("b", time.sleep, SLEEP, iters=5, warmup=0, control=False)
""")


def _step_env(tmp_path: Path, git_env: dict[str, str]) -> dict[str, str]:
    """What the steps run with here: this Python as ``python`` and ``pytest``, the plugin
    from this checkout, a save of one measurement, no torch._dynamo in the fork server (the
    recipe's tests train no model), and the recipe's options."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name, args in (("python", ""), ("pytest", " -m pytest")):
        (folder / name).write_text(f'#!/bin/sh\nexec {sys.executable}{args} "$@"\n')
        (folder / name).chmod(0o755)
    env = quick_env({**os.environ, "PYTHONPATH": str(ROOT)})
    env["PATH"] = f"{folder}{os.pathsep}{env['PATH']}"
    env["PYTEST_ADDOPTS"] += f" -p distperf_one_save {' '.join(NO_DYNAMO)} -p no:cacheprovider"
    args = WORKFLOW["env"]["DISTPERF_ARGS"]
    return {**env, **git_env, "DISTPERF_CI": str(CI), "DISTPERF_ARGS": args}


def _summary(work: Path) -> str:
    path = work / ".step_summary.md"
    text = path.read_text()
    path.unlink()
    return text


def test_the_recipe_from_the_first_run_to_a_resave(tmp_path: Path) -> None:
    origin, work, git_env = scratch(tmp_path, {
        "pytest.ini": "[pytest]\n", "tests/perf/test_two.py": PERF.format(sleep=0.004)})
    env = _step_env(tmp_path, git_env)
    left_out = {"Install": 0}

    # 1. The first push to main: nothing to compare with, said first; both tests saved and
    #    proposed; the history branch made.
    steps = run_job(WORKFLOW, "baselines", push("main"), work, env, left_out)
    compared = steps["Compare main with its baselines"]
    assert compared.returncode == 0, compared.output
    assert _summary(work).startswith(
        "## distperf: nothing compared\n\n> [!WARNING]\n> **NOTHING WAS COMPARED: ")
    assert (work / "distperf/to-save.txt").read_text().splitlines() == [
        "tests/perf/test_two.py::test_a", "tests/perf/test_two.py::test_b"]
    assert steps["Save them on this runner"].returncode == 0, steps["Save them on this runner"]
    proposed = steps["Propose the baselines"]
    assert proposed.ran and (work / proposed.inputs["body-path"]).is_file()
    assert "Baselines saved for 2 test(s)" in (work / proposed.inputs["body-path"]).read_text()
    history = run_job(WORKFLOW, "history", push("main"), work, env)
    assert history["Create the gh-pages branch (first run only)"].returncode == 0
    assert history["Record the history (lower is better)"].ran
    assert git(origin, "ls-tree", "gh-pages", env=git_env) == ""

    # 2. The baseline pull request, merged: it changes perf_baselines/ alone and starts nothing.
    made = _script("commit-baselines.sh", work, "distperf/baselines", "baselines", env=env)
    assert made.returncode == 0, made.stdout + made.stderr
    git(work, "push", "-q", "origin", "HEAD:main", env=git_env)
    changed = tuple(_changed(work, "HEAD", git_env))
    assert changed == ("perf_baselines/tests/perf/test_two.toml",)
    assert jobs_run(WORKFLOW, push("main", changed)) == []

    # 3. A pull request with an intended slowdown, labelled distperf-resave: saved on the
    #    runner and committed to its branch.
    git(work, "checkout", "-q", "-b", "feature", env=git_env)
    (work / "tests/perf/test_two.py").write_text(PERF.format(sleep=0.012))
    git(work, "commit", "-qam", "a slower step, on purpose", env=git_env)
    git(work, "push", "-q", "origin", "feature", env=git_env)
    labelled = pull_request("labeled", LABEL)
    assert jobs_run(WORKFLOW, labelled) == ["resave"]
    steps = run_job(WORKFLOW, "resave", labelled, work, env, left_out)
    assert steps["Save on this runner"].returncode == 0, steps["Save on this runner"].output
    committed = steps["Commit the baselines to the branch"]
    assert committed.returncode == 0, committed.output
    pushed = git(origin, "rev-parse", "feature", env=git_env)
    assert _changed(origin, pushed, git_env) == list(changed)
    assert steps["Remove the label (add it again to re-save)"].ran
    _summary(work)

    # 4. That commit's run (pushed with a token that starts runs): compare only, against the
    #    re-saved baselines, which it compares with; and main, once it is merged, saves none.
    again = pull_request("synchronize")
    assert jobs_run(WORKFLOW, again) == ["compare"]
    steps = run_job(WORKFLOW, "compare", again, work, env, left_out)
    assert steps["Compare with the baselines"].returncode == 0, steps[
        "Compare with the baselines"].output
    assert "NOTHING WAS COMPARED" not in _summary(work)
    assert steps["Is there a history to compare with?"].outputs == {"found": "true"}
    assert steps["Trend against main (lower is better)"].ran
    report = json.loads((work / "distperf/report.json").read_text())
    assert {v["verdict"] for t in report["tests"] for v in t["verdicts"]} <= {
        "unchanged", "inconclusive", "improved"}
    rest = _script("tests-to-save.py", work, "distperf/report.json", env={})
    assert rest.returncode == 0 and rest.stdout == ""
