"""The environment key of the baselines: built from the ranks' facts, compared with the one a
file stores, and what a save or a comparison says about it.  Pure.

A key holds what a run's figures depend on.  On CPU ranks: the backend, the world size, the
CPU model, the cores the ranks may use, each rank's threads and binding, torch's version.
On GPUs: the GPU model and count, the driver, torch's CUDA runtime, NCCL, how the GPUs
are linked (NVLink or PCIe), and how many ranks share a GPU where they do; not the host's
CPU or cores.  A pinned name
(``--distperf-env-name``) stands for the machine: its details
(:data:`~pytest_distperf.records.MACHINE_FIELDS`) then key nothing, and a fleet of like
runners shares one baseline, still kept apart by what the measurement itself depends on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence, Set
from typing import Any

from pytest_distperf.records import MACHINE_FIELDS, NOT_COMPARABLE, Environment, Verdict
from pytest_distperf.verdict.storefile import ENV_FIELDS, OPTIONAL_ENV_FIELDS

#: Optional fields a file writes only when they are set: files of runs without them keep
#: their bytes.
_WRITTEN_WHEN_SET = ("driver_version", "cuda_version", "interconnect", "name", "ranks_per_gpu")
#: What to do where runners of one type differ in the machine's details.
PIN_ADVICE = ("pin a name for the runner type, the same in the jobs that save and compare: "
              "--distperf-env-name NAME (ini distperf_env_name)")


def environment_of(infos: Sequence[Mapping[str, Any]], backend: str, device_type: str,
                   world_size: int, name: str = "") -> Environment:
    """The environment of a group of ``world_size`` ranks, from their facts (``infos``: each
    rank's ``rank_info()``, rank 0 first); ``name``: the pinned name, or ""."""
    first = infos[0]
    cpu = device_type == "cpu"

    def count(key: str) -> int:
        return int(first.get(key, 0)) if cpu else 0

    def gpu(key: str) -> str:
        return "" if cpu else str(first.get(key, "") or "")

    gpus = [] if cpu else gpus_of(infos[:world_size])
    shared = max(map(len, gpus), default=0)
    return Environment(
        backend=backend, device_type=device_type,
        device_model=str(first.get("device_model", "")),
        device_count=len(gpus), world_size=world_size,
        torch_version=str(first.get("torch_version", "")),
        nccl_version=str(first.get("nccl_version", "") or ""),
        cpu_cores=count("cores"), threads_per_rank=count("threads"),
        bound_cores=count("bound_cores"), driver_version=gpu("driver_version"),
        cuda_version=gpu("cuda_version"),
        interconnect="" if cpu else interconnect(
            [int(infos[ranks[0]].get("nvlinks", -1)) for ranks in gpus]),
        name=name, ranks_per_gpu=shared if shared > 1 else 0)


def gpus_of(infos: Sequence[Mapping[str, Any]]) -> list[list[int]]:
    """The ranks on each GPU (by host and device index), from the ranks' facts; a GPU per
    rank where a rank does not say its device."""
    by_gpu: dict[tuple[str, int], list[int]] = {}
    for rank, info in enumerate(infos):
        index = int(info.get("device_index", -1))
        key = (str(info.get("hostname", "")), index) if index >= 0 else ("rank", rank)
        by_gpu.setdefault(key, []).append(rank)
    return list(by_gpu.values())


def interconnect(nvlinks: Sequence[int]) -> str:
    """How a group's GPUs are linked, from each one's active NVLinks: ``nvlink`` (every GPU
    has one), ``pcie`` (none has), ``mixed``; "" for one GPU, which talks to no other, or
    where a count is unknown (-1)."""
    if len(nvlinks) < 2 or any(n < 0 for n in nvlinks):
        return ""
    if all(nvlinks):
        return "nvlink"
    return "mixed" if any(nvlinks) else "pcie"


def environment_id(env: Environment) -> str:
    """The key an environment's baselines live under, e.g.
    ``gloo-cpu-w2-c2t1-torch2.13.0-amd-epyc``,
    ``nccl-cuda-w8-torch2.6.0-cuda12.4-nccl2.21.5-driver550.54.15-nvlink-nvidia-h100`` or,
    under a pinned name, ``gloo-cpu-w2-t1-torch2.13.0@ubuntu-latest``
    (:meth:`Environment.baselines_key`)."""
    return env.baselines_key()


def environment_table(env: Environment) -> dict[str, Any]:
    """The ``[environments]`` table a save writes for ``env``: its fields as keyed."""
    keyed = env.keyed()
    return {name: getattr(keyed, name) for name, _ in (*ENV_FIELDS, *OPTIONAL_ENV_FIELDS)
            if name not in _WRITTEN_WHEN_SET or getattr(keyed, name)}


def _differences(stored: Mapping[str, Any], env: Environment) -> list[tuple[str, Any, Any]]:
    """(field, stored value, this run's) of every keyed field that differs; the machine's
    details are not compared where either side has a pinned name."""
    mine = env.keyed()
    pinned = bool(mine.name or stored.get("name"))
    out = []
    for name, kind in (*ENV_FIELDS, *OPTIONAL_ENV_FIELDS):
        if pinned and name in MACHINE_FIELDS:
            continue
        ours, theirs = getattr(mine, name), stored.get(name)
        if theirs is None and (name, kind) in OPTIONAL_ENV_FIELDS:
            theirs = kind()  # a file from before the field: 0 or ""
        if name == "torch_version":  # the local build tag (+cpu, +cu124) is not compared
            ours, theirs = str(ours).split("+")[0], str(theirs).split("+")[0]
        if ours != theirs:
            out.append((name, theirs, ours))
    return out


def _said(differences: Sequence[tuple[str, Any, Any]]) -> str:
    return "; ".join(f"{name} {theirs!r} there, {ours!r} here"
                     for name, theirs, ours in differences)


def same_environment(stored: Mapping[str, Any], env: Environment) -> str:
    """Empty when ``stored`` describes ``env``; else what differs."""
    return _said(_differences(stored, env))


def machine_only(stored: Mapping[str, Any], env: Environment) -> str:
    """What differs, where ``stored`` differs from ``env`` in the machine's details alone
    (runners of one type that a pinned name would join); else ""."""
    differences = _differences(stored, env)
    if differences and all(name in MACHINE_FIELDS for name, _, _ in differences):
        return _said(differences)
    return ""


def machine_twins(environments: Mapping[str, Mapping[str, Any]], env_ids: Sequence[str],
                  env: Environment) -> list[tuple[str, str]]:
    """(environment id, what differs) of each of ``env_ids`` (a test's entries in a file
    whose ``environments`` table is given) that differs from ``env`` in the machine's
    details alone."""
    here = environment_id(env)
    found = [(e, machine_only(environments.get(e, {}), env)) for e in env_ids if e != here]
    return [(e, differs) for e, differs in found if differs]


def hosted_runner(env: Environment, variables: Mapping[str, str]) -> str:
    """A warning where ``env``, unpinned, is keyed by a detail that GitHub-hosted runners
    (``variables``: the process's environment) change between runs of one label; else ""."""
    if env.name or variables.get("GITHUB_ACTIONS") != "true" \
            or variables.get("RUNNER_ENVIRONMENT") != "github-hosted":
        return ""
    held = (f"the CPU model {env.device_model!r}" if env.device_type == "cpu"
            else f"the driver {env.driver_version!r}" if env.driver_version else "")
    if not held:
        return ""
    return (f"distperf: these baselines are keyed by {held}, which GitHub-hosted runners of "
            "one label do not keep from run to run: a run on another one finds no baseline "
            f"of its own and passes having compared nothing; {PIN_ADVICE}, e.g. "
            "--distperf-env-name ubuntu-latest")


def save_warnings(env: Environment, environments: Mapping[str, Mapping[str, Any]],
                  env_ids: Sequence[str], where: str, variables: Mapping[str, str]
                  ) -> list[str]:
    """What a save of a test in ``env`` warns about its key: a hosted runner's detail in it
    (:func:`hosted_runner`), and the test's entries in its baseline file ``where``
    (``env_ids``, described in ``environments``) that differ from ``env`` in the machine's
    details alone."""
    out = [hosted_runner(env, variables)]
    out += [f"distperf: {where} already holds baselines of this test for {other}, which "
            f"differs from this run only in the machine's details ({differs}): each kind of "
            f"machine keeps its own baselines and meets only them; if these runners are of "
            f"one type, {PIN_ADVICE}"
            for other, differs in machine_twins(environments, env_ids, env)]
    return [text for text in out if text]


def with_pin_advice(verdicts: Sequence[Verdict], environments: Mapping[str, Mapping[str, Any]],
                    env_ids: Sequence[str], env: Environment, skip: Set[str] = frozenset()
                    ) -> list[Verdict]:
    """``verdicts``, each ``not comparable`` one (but those of ``skip``, metrics not
    comparable for another reason) told to pin a name where the test's only baselines
    (``env_ids``) include one that differs from this run in the machine's details alone."""
    if environment_id(env) in env_ids or not machine_twins(environments, env_ids, env):
        return list(verdicts)
    advice = ("those baselines differ from this run in the machine's details alone: if these "
              f"runners are of one type, {PIN_ADVICE}")
    return [dataclasses.replace(v, detail=f"{v.detail}; {advice}")
            if v.verdict == NOT_COMPARABLE and v.metric not in skip else v for v in verdicts]
