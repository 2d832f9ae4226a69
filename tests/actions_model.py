"""As much of GitHub Actions as the example workflow (examples/ci/distperf.yml) uses, to check
it here: which events start it (``on:`` with branches, paths-ignore and types), which jobs
an event runs (their ``if:`` and ``needs:``), and a job's ``run:`` steps executed in a
folder with bash, as a runner would, its actions (``uses:``) only judged by their ``if:``.

Expressions: strings, ``==``, ``!=``, ``!``, ``&&``, ``||``, parentheses, context paths and
the functions the workflow calls. Unlike GitHub, ``==`` on strings is case-sensitive.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import re
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

_TOKEN = re.compile(r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<op>&&|\|\||==|!=|!|\(|\)|,)"
                    r"|(?P<name>[A-Za-z_][\w.-]*))")
_LITERALS = {"true": "True", "false": "False", "null": "None"}
_STATUS = re.compile(r"\b(success|failure|cancelled|always)\(")
_EXPRESSION = re.compile(r"\$\{\{(.*?)\}\}", re.S)


def load(path: Path) -> dict[str, Any]:
    """The workflow, with its ``on:`` under "on" (YAML 1.1 reads a bare ``on`` as true)."""
    data: dict[Any, Any] = yaml.safe_load(path.read_text())
    data["on"] = data.pop(True)
    return data


@dataclasses.dataclass(frozen=True)
class Event:
    """An event as a workflow sees it: ``github.event_name``, the payload, the ref, and for a
    push the files it changed."""

    name: str
    payload: dict[str, Any]
    ref_name: str
    head_ref: str = ""
    changed: tuple[str, ...] = ()


REPOSITORY = "o/r"
_DEFAULT = {"repository": {"default_branch": "main", "full_name": REPOSITORY}}


def push(branch: str, changed: tuple[str, ...] = ("src/model.py",)) -> Event:
    return Event("push", dict(_DEFAULT), branch, changed=changed)


def pull_request(action: str, label: str = "", *, head: str = "feature",
                 fork: bool = False) -> Event:
    repo = "someone/r" if fork else REPOSITORY
    payload: dict[str, Any] = {
        **_DEFAULT, "action": action,
        "pull_request": {"number": 7, "head": {"ref": head, "repo": {"full_name": repo}}}}
    if label:
        payload["label"] = {"name": label}
    return Event("pull_request", payload, "7/merge", head_ref=head)


def dispatch(branch: str) -> Event:
    return Event("workflow_dispatch", dict(_DEFAULT), branch)


def context(event: Event, **more: Any) -> dict[str, Any]:
    """The contexts an expression reads: ``github``, ``secrets`` (none set) and ``more``."""
    github = {"event_name": event.name, "event": event.payload, "ref_name": event.ref_name,
              "head_ref": event.head_ref, "repository": REPOSITORY, "token": "ghs_token",
              "sha": "0" * 40}
    return {"github": github, "secrets": {"GITHUB_TOKEN": "ghs_token"}, **more}


def evaluate(expression: str, ctx: Mapping[str, Any],
             functions: Mapping[str, Callable[..., Any]] | None = None) -> Any:
    """The value of one expression (with or without its ``${{ }}``)."""
    text = expression.strip()
    if text.startswith("${{") and text.endswith("}}"):
        text = text[3:-2]
    text = text.strip()
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"cannot read the expression at {text[pos:]!r}")
        pos = m.end()
        if m["str"] is not None:
            out.append(repr(m["str"][1:-1].replace("''", "'")))
        elif m["op"]:
            out.append({"&&": " and ", "||": " or ", "!": " not "}.get(m["op"], m["op"]))
        elif m["name"] in _LITERALS:
            out.append(_LITERALS[m["name"]])
        elif text[pos:].lstrip().startswith("("):
            out.append(f"_call[{m['name']!r}]")
        else:
            out.append(f"_get({m['name']!r})")
    calls = {"contains": lambda a, b: str(b).lower() in str(a).lower(),
             "startsWith": lambda a, b: str(a).lower().startswith(str(b).lower()),
             "success": lambda: True, "failure": lambda: False,
             "cancelled": lambda: False, "always": lambda: True, **(functions or {})}
    # Python of our own making from the tokens above: names only reach _get and _call
    return eval("".join(out), {"__builtins__": {}},
                {"_call": calls, "_get": lambda path: _lookup(ctx, path)})


def _lookup(ctx: Mapping[str, Any], path: str) -> Any:
    value: Any = ctx
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def substitute(text: str, ctx: Mapping[str, Any]) -> str:
    """``text`` with each ``${{ ... }}`` replaced by its value, as GitHub does in a string."""
    def value(m: re.Match[str]) -> str:
        v = evaluate(m[1], ctx)
        return "" if v is None else ("true" if v is True else "false" if v is False else str(v))
    return _EXPRESSION.sub(value, text)


def _glob(pattern: str) -> re.Pattern[str]:
    """A filter pattern of ``on:`` (``**`` crosses folders, ``*`` does not)."""
    parts = re.split(r"(\*\*|\*|\?)", pattern)
    return re.compile("".join({"**": ".*", "*": "[^/]*", "?": "[^/]"}.get(p, re.escape(p))
                              for p in parts) + r"\Z")


def starts(workflow: Mapping[str, Any], event: Event) -> bool:
    """Whether ``event`` starts a run of the workflow at all."""
    on = workflow["on"]
    if event.name not in on:
        return False
    spec = on[event.name] or {}
    if event.name == "push":
        if "branches" in spec and not any(fnmatch.fnmatchcase(event.ref_name, b)
                                          for b in spec["branches"]):
            return False
        ignored = [_glob(p) for p in spec.get("paths-ignore", ())]
        if ignored and all(any(g.match(f) for g in ignored) for f in event.changed):
            return False
    if event.name == "pull_request":
        types = spec.get("types", ["opened", "synchronize", "reopened"])
        return bool(event.payload["action"] in types)
    return True


def _condition(expression: Any, state_ok: bool, ctx: Mapping[str, Any],
               functions: Mapping[str, Callable[..., Any]]) -> bool:
    """A job's or step's ``if:``: without a status function, ``success() &&`` comes first."""
    text = "success()" if expression is None else str(expression)
    calls = {"success": lambda: state_ok, "failure": lambda: not state_ok, **functions}
    if not _STATUS.search(text) and not state_ok:
        return False
    return bool(evaluate(text, ctx, calls))


def jobs_run(workflow: Mapping[str, Any], event: Event) -> list[str]:
    """The jobs ``event`` runs, in the file's order, each assumed to succeed; a job whose
    needs did not run is skipped unless its ``if:`` asks for a status."""
    if not starts(workflow, event):
        return []
    ran: list[str] = []
    for name, job in workflow["jobs"].items():
        needs = job.get("needs", [])
        needs = [needs] if isinstance(needs, str) else needs
        ok = all(n in ran for n in needs)
        if _condition(job.get("if"), ok, context(event), {}):
            ran.append(name)
    return ran


@dataclasses.dataclass
class Step:
    """One step of a job as run here: ``ran`` False where its ``if:`` skipped it; an action
    (``uses:``) or a step pretended is not executed, and has its ``with:`` evaluated."""

    name: str
    ran: bool
    returncode: int = 0
    output: str = ""
    outputs: dict[str, str] = dataclasses.field(default_factory=dict)
    inputs: dict[str, str] = dataclasses.field(default_factory=dict)


def run_job(workflow: Mapping[str, Any], job_name: str, event: Event, folder: Path,
            env: Mapping[str, str], pretend: Mapping[str, int] | None = None
            ) -> dict[str, Step]:
    """Run the job's ``run:`` steps in ``folder`` with bash as GitHub's ``shell: bash`` does:
    this process's environment, the workflow's, the job's and the step's env over it, then
    ``env`` over those. A step named in ``pretend`` (an install, a call to GitHub's API) is
    judged by its ``if:`` but not run: it ends with the exit status given there. After a step
    fails, only steps whose ``if:`` asks for a status run, as on GitHub."""
    pretend = pretend or {}
    job = workflow["jobs"][job_name]
    summary, output_file = folder / ".step_summary.md", folder / ".github_output"
    steps: dict[str, dict[str, Any]] = {}
    results: dict[str, Step] = {}
    ok = True
    for spec in job["steps"]:
        name = spec.get("name") or spec["uses"]
        ctx = context(event, steps=steps)
        files = {"hashFiles": lambda *globs: "h" if any(folder.glob(g) for g in globs) else ""}
        if not _condition(spec.get("if"), ok, ctx, files):
            results[name] = Step(name, ran=False)
            steps[spec.get("id", name)] = {"outcome": "skipped", "outputs": {}}
            continue
        if "uses" in spec or name in pretend:
            inputs = {k: substitute(str(v), ctx) for k, v in (spec.get("with") or {}).items()}
            code = pretend.get(name, 0)
            ok = ok and code == 0
            results[name] = Step(name, ran=True, returncode=code, inputs=inputs)
            steps[spec.get("id", name)] = {"outcome": "success" if code == 0 else "failure",
                                           "outputs": {}}
            continue
        variables = dict(os.environ)
        for layer in (workflow.get("env"), job.get("env"), spec.get("env")):
            variables.update({k: substitute(str(v), ctx) for k, v in (layer or {}).items()})
        variables.update(env)
        output_file.write_text("")
        variables.update(GITHUB_EVENT_NAME=event.name, GITHUB_OUTPUT=str(output_file),
                         GITHUB_STEP_SUMMARY=str(summary), GITHUB_REPOSITORY=REPOSITORY)
        proc = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c",
             substitute(spec["run"], ctx)], cwd=folder, env=variables, capture_output=True,
            text=True, timeout=600, check=False)
        outputs = dict(line.split("=", 1) for line in output_file.read_text().splitlines())
        outcome = "success" if proc.returncode == 0 else "failure"
        ok = ok and proc.returncode == 0
        results[name] = Step(name, True, proc.returncode, proc.stdout + proc.stderr, outputs)
        steps[spec.get("id", name)] = {"outcome": outcome, "outputs": outputs}
    return results
