"""The environment key: assembled from the ranks' facts (CPU and GPU), a pinned name in place
of the machine, files that keep reading, and what a save or a comparison says about the key.
Pure unit tests: the GPU's facts come from made-up rank info and a fake NVML (no ranks)."""

from __future__ import annotations

import dataclasses
import shutil
import types
from pathlib import Path
from typing import Any

import pytest

from pytest_distperf import verdict as bl
from pytest_distperf.rank import gpu
from pytest_distperf.records import NOT_COMPARABLE, Environment, Measurement, Metric
from pytest_distperf.verdict import environment as envkey
from pytest_distperf.verdict.noise import NoiseFigures

DATA = Path(__file__).parent / "data"
QUIET = NoiseFigures(1.0, 0.05, 0.08)
TIMES = tuple(0.020 + 0.0002 * i for i in range(20))
#: A rank's facts as rank.worker.describe gives them on a 4-core CPU runner.
CPU_INFO = {"rank": 0, "hostname": "runner-1", "torch_version": "2.13.0+cpu", "threads": 2,
            "cores": 4, "bound_cores": 0, "nccl_version": "", "device_model": "AMD EPYC 7763"}
#: ... and on an H100 box: the CPU's facts are there too, and key nothing.
GPU_INFO = {**CPU_INFO, "cores": 104, "threads": 13, "device_model": "NVIDIA H100 80GB HBM3",
            "nccl_version": "2.21.5", "torch_version": "2.6.0+cu124", "cuda_version": "12.4",
            "driver_version": "550.54.15", "nvlinks": 18}
HOSTED = {"GITHUB_ACTIONS": "true", "RUNNER_ENVIRONMENT": "github-hosted"}


def cpu_env(model: str = "AMD EPYC 7763", cores: int = 4, threads: int = 2, name: str = "",
            world: int = 2, bound: int = 0) -> Environment:
    info = {**CPU_INFO, "device_model": model, "cores": cores, "threads": threads,
            "bound_cores": bound}
    return envkey.environment_of([info] * world, "gloo", "cpu", world, name)


def gpu_env(world: int = 8, name: str = "", **facts: Any) -> Environment:
    return envkey.environment_of([{**GPU_INFO, **facts}] * world, "nccl", "cuda", world, name)


# -- assembly ---------------------------------------------------------------------------------
def test_a_cpu_key_holds_the_cpu_its_cores_threads_and_binding() -> None:
    env = cpu_env(bound=2)
    assert env == Environment("gloo", "cpu", "AMD EPYC 7763", 0, 2, "2.13.0+cpu", "", 4, 2, 2)
    assert bl.environment_id(env) == "gloo-cpu-w2-c4t2b2-torch2.13.0-amd-epyc-7763"


def test_a_gpu_key_holds_what_changes_gpu_figures_and_not_the_host_cpu() -> None:
    env = gpu_env()
    assert (env.device_model, env.device_count, env.driver_version, env.cuda_version,
            env.nccl_version, env.interconnect) == (
        "NVIDIA H100 80GB HBM3", 8, "550.54.15", "12.4", "2.21.5", "nvlink")
    assert (env.cpu_cores, env.threads_per_rank, env.bound_cores) == (0, 0, 0)
    assert bl.environment_id(env) == ("nccl-cuda-w8-torch2.6.0-cuda12.4-nccl2.21.5-"
                                      "driver550.54.15-nvlink-nvidia-h100-80gb-hbm3")
    # another host CPU, another hostname: the same key
    other_host = gpu_env(device_model="NVIDIA H100 80GB HBM3", cores=64, hostname="node-7")
    assert bl.environment_id(other_host) == bl.environment_id(env)


@pytest.mark.parametrize(("facts", "differs"), [
    ({"device_model": "NVIDIA A100-SXM4-80GB"}, "device_model"),
    ({"driver_version": "560.35.03"}, "driver_version"),
    ({"cuda_version": "12.6"}, "cuda_version"),
    ({"nccl_version": "2.23.4"}, "nccl_version"),
    ({"nvlinks": 0}, "interconnect"),
])
def test_each_gpu_detail_keeps_baselines_apart(facts: dict[str, Any], differs: str) -> None:
    env, other = gpu_env(), gpu_env(**facts)
    assert bl.environment_id(other) != bl.environment_id(env)
    stored = envkey.environment_table(env)
    assert bl.same_environment(stored, other).startswith(f"{differs} ")


@pytest.mark.parametrize(("nvlinks", "linked"), [
    ([18, 18, 18, 18], "nvlink"), ([0, 0], "pcie"), ([2, 2, 0, 0], "mixed"),
    ([18], ""),  # one GPU talks to no other
    ([18, -1], ""),  # NVML could not read one: unknown, never guessed
])
def test_the_interconnect_from_each_gpus_active_nvlinks(nvlinks: list[int], linked: str) -> None:
    assert envkey.interconnect(nvlinks) == linked
    infos = [{**GPU_INFO, "nvlinks": n} for n in nvlinks]
    assert envkey.environment_of(infos, "nccl", "cuda", len(infos)).interconnect == linked


def test_a_gpu_rank_without_nvml_or_driver_facts_keys_what_it_knows() -> None:
    bare = {k: v for k, v in GPU_INFO.items()
            if k not in ("driver_version", "cuda_version", "nvlinks")}
    env = envkey.environment_of([bare, bare], "nccl", "cuda", 2)
    assert (env.driver_version, env.cuda_version, env.interconnect) == ("", "", "")
    assert bl.environment_id(env) == ("nccl-cuda-w2-torch2.6.0-nccl2.21.5-"
                                      "nvidia-h100-80gb-hbm3")


def on_gpus(devices: list[int], backend: str = "nccl") -> Environment:
    """The environment of ranks on ``devices`` (each rank's CUDA device) of one host."""
    infos = [{**GPU_INFO, "device_index": d, "rank": r} for r, d in enumerate(devices)]
    if backend == "gloo":  # rank.worker.describe: no NCCL on gloo ranks
        infos = [{**info, "nccl_version": ""} for info in infos]
    return envkey.environment_of(infos, backend, "cuda", len(devices))


@pytest.mark.parametrize(("devices", "backend", "count", "shared", "key"), [
    ([0, 1], "nccl", 2, 0, "nccl-cuda-w2-torch2.6.0-cuda12.4-nccl2.21.5-driver550.54.15-nvlink"),
    ([0, 0], "nccl", 1, 2, "nccl-cuda-w2-2pergpu-torch2.6.0-cuda12.4-nccl2.21.5-"
                           "driver550.54.15"),
    ([0, 1, 0, 1], "nccl", 2, 2, "nccl-cuda-w4-2pergpu-torch2.6.0-cuda12.4-nccl2.21.5-"
                                 "driver550.54.15-nvlink"),
    ([0, 0], "gloo", 1, 2, "gloo-cuda-w2-2pergpu-torch2.6.0-cuda12.4-driver550.54.15"),
    ([0, 0, 0], "gloo", 1, 3, "gloo-cuda-w3-3pergpu-torch2.6.0-cuda12.4-driver550.54.15"),
])
def test_ranks_sharing_a_gpu_are_keyed_apart_from_a_rank_per_gpu(
        devices: list[int], backend: str, count: int, shared: int, key: str) -> None:
    env = on_gpus(devices, backend)
    assert (env.device_count, env.ranks_per_gpu) == (count, shared)
    assert env.key() == key
    one_each = on_gpus(list(range(len(devices))))
    if shared:
        said = bl.same_environment(envkey.environment_table(one_each), env)
        assert f"ranks_per_gpu 0 there, {shared} here" in said


def test_ranks_on_one_gpu_of_several_hosts_are_that_many_gpus() -> None:
    infos = [{**GPU_INFO, "device_index": 0, "hostname": f"node-{r}"} for r in range(4)]
    env = envkey.environment_of(infos, "nccl", "cuda", 4)
    assert (env.device_count, env.ranks_per_gpu) == (4, 0)


def test_a_table_of_ranks_sharing_a_gpu_reads_back_and_one_per_gpu_writes_no_field(
        tmp_path: Path) -> None:
    assert "ranks_per_gpu" not in envkey.environment_table(gpu_env())
    shared = on_gpus([0, 0], "gloo")
    assert envkey.environment_table(shared)["ranks_per_gpu"] == 2
    save(tmp_path / "gpu.toml", shared)
    assert "ranks_per_gpu = 2" in (tmp_path / "gpu.toml").read_text()
    stored = bl.load(tmp_path / "gpu.toml")
    assert stored is not None
    table = stored.environments()[bl.environment_id(shared)]
    assert bl.same_environment(table, shared) == ""


# -- a pinned name ----------------------------------------------------------------------------
def test_a_pinned_name_stands_for_the_machine() -> None:
    epyc, xeon = cpu_env(name="ubuntu-latest"), cpu_env("Intel Xeon 8370C", 8, name="ubuntu-latest")
    assert bl.environment_id(epyc) == "gloo-cpu-w2-t2-torch2.13.0@ubuntu-latest"
    assert bl.environment_id(xeon) == bl.environment_id(epyc)
    assert bl.same_environment(envkey.environment_table(epyc), xeon) == ""
    h100, other = gpu_env(name="h100x8"), gpu_env(name="h100x8", driver_version="560.35.03",
                                                    nvlinks=0)
    assert bl.environment_id(h100) == ("nccl-cuda-w8-torch2.6.0-cuda12.4-nccl2.21.5@h100x8")
    assert bl.environment_id(other) == bl.environment_id(h100)


@pytest.mark.parametrize("change", [
    {"world": 4}, {"threads": 1}, {"bound": 1}, {"name": "ubuntu-24.04"},
])
def test_under_a_pinned_name_what_the_measurement_depends_on_still_keeps_apart(
        change: dict[str, Any]) -> None:
    pinned = cpu_env(name="ubuntu-latest")
    other = cpu_env(**{"name": "ubuntu-latest", **change})
    assert bl.environment_id(other) != bl.environment_id(pinned)
    assert bl.same_environment(envkey.environment_table(pinned), other) != ""


def test_a_pinned_environment_stores_no_machine_detail_and_compares_none() -> None:
    table = envkey.environment_table(cpu_env(name="ubuntu-latest"))
    assert table["name"] == "ubuntu-latest"
    assert (table["device_model"], table["cpu_cores"]) == ("", 0)
    # an unpinned entry and a pinned run differ in the name alone, never in '' vs a CPU
    said = bl.same_environment(envkey.environment_table(cpu_env()),
                               cpu_env(name="ubuntu-latest"))
    assert said == "name '' there, 'ubuntu-latest' here"


def test_an_unpinned_table_is_written_as_before() -> None:
    """A run without a pinned name on CPU ranks writes the fields a file always held, so
    that a re-save changes no line of its environment."""
    assert list(envkey.environment_table(cpu_env())) == [
        "backend", "device_type", "device_model", "device_count", "world_size",
        "torch_version", "nccl_version", "cpu_cores", "threads_per_rank", "bound_cores"]
    assert set(envkey.environment_table(gpu_env())) >= {"driver_version", "cuda_version",
                                                        "interconnect"}


def save(path: Path, env: Environment, test: str = "test_a") -> None:
    base = bl.StoredMetric("s", False, bl.Measured(TIMES[10], bl.Samples(TIMES)))
    bl.save_test(path, "tests/test_x.py", test, [bl.SaveEntry(env, {"w.time_s": base})],
                 saved_at="2026-11-27T00:00:00Z")


def judged(file: bl.BaselineFile | None, env: Environment, test: str = "test_a") -> Any:
    metrics = [Metric("w.time_s", TIMES[10], "s", False, TIMES)]
    measurement = Measurement("m", tuple(metrics), None, lambda: list(metrics))
    j = bl.make_judgement(save=False, measurements=[measurement], environment=env,
                          first_noise=QUIET, tolerance=0.10, baseline=file, test=test)
    while j.wanted():
        j.add_measurement("m", metrics, QUIET)
    return j


def test_runners_of_one_pinned_name_share_a_baseline_through_the_file(tmp_path: Path) -> None:
    path = tmp_path / "test_x.toml"
    save(path, cpu_env(name="ubuntu-latest"))
    file = bl.load(path)
    assert file is not None
    assert 'name = "ubuntu-latest"' in path.read_text()
    (verdict,) = judged(file, cpu_env("Intel Xeon 8370C", 8, name="ubuntu-latest")).verdicts()
    assert verdict.verdict == "unchanged"
    (unpinned,) = judged(file, cpu_env()).verdicts()  # a run without the name: not this one
    assert unpinned.verdict == NOT_COMPARABLE and "name 'ubuntu-latest' there, '' here" in \
        unpinned.detail


def test_files_saved_before_the_gpu_fields_and_the_name_keep_reading(tmp_path: Path) -> None:
    """The kept version-1 file, and a GPU entry without driver, runtime and links: read,
    valid, and compared as before where the run is the same; a GPU run that now knows its
    driver is told what differs."""
    path = tmp_path / "test_gate.toml"
    shutil.copy(DATA / "baseline_v1_ddp_step.toml", path)
    file = bl.load(path)
    assert file is not None
    ((env_id, table),) = file.environments().items()
    old = Environment(**{k: table[k] for k in (
        "backend", "device_type", "device_model", "device_count", "world_size",
        "torch_version", "nccl_version", "cpu_cores", "threads_per_rank", "bound_cores")})
    assert bl.environment_id(old) == env_id and bl.same_environment(table, old) == ""
    before = gpu_env(driver_version="", cuda_version="", nvlinks=-1)
    save(tmp_path / "gpu.toml", before)
    stored = bl.load(tmp_path / "gpu.toml")
    assert stored is not None
    assert bl.same_environment(stored.environments()[bl.environment_id(before)], gpu_env()) == (
        "driver_version '' there, '550.54.15' here; cuda_version '' there, '12.4' here; "
        "interconnect '' there, 'nvlink' here")


# -- what a save and a comparison say --------------------------------------------------------
def test_a_save_on_a_github_hosted_runner_keyed_by_its_cpu_warns_to_pin_a_name() -> None:
    (warning,) = envkey.save_warnings(cpu_env(), {}, [], "perf_baselines/test_x.toml", HOSTED)
    assert warning.startswith("distperf: these baselines are keyed by the CPU model "
                              "'AMD EPYC 7763', which GitHub-hosted runners of one label do not "
                              "keep from run to run")
    assert "--distperf-env-name NAME (ini distperf_env_name)" in warning
    assert envkey.save_warnings(cpu_env(name="ubuntu-latest"), {}, [], "f", HOSTED) == []
    assert envkey.save_warnings(cpu_env(), {}, [], "f", {**HOSTED,
                                                         "RUNNER_ENVIRONMENT": "self-hosted"}) == []
    assert envkey.save_warnings(cpu_env(), {}, [], "f", {}) == []
    (driver,) = envkey.save_warnings(gpu_env(), {}, [], "f", HOSTED)
    assert "keyed by the driver '550.54.15'" in driver


def test_a_save_beside_an_entry_that_differs_in_the_machine_alone_says_so() -> None:
    epyc, xeon = cpu_env(), cpu_env("Intel Xeon 8370C")
    environments = {bl.environment_id(epyc): envkey.environment_table(epyc)}
    (warning,) = envkey.save_warnings(xeon, environments, [bl.environment_id(epyc)],
                                      "perf_baselines/test_x.toml", {})
    assert warning == (
        "distperf: perf_baselines/test_x.toml already holds baselines of this test for "
        "gloo-cpu-w2-c4t2-torch2.13.0-amd-epyc-7763, which differs from this run only in the "
        "machine's details (device_model 'AMD EPYC 7763' there, 'Intel Xeon 8370C' here): each "
        "kind of machine keeps its own baselines and meets only them; if these runners are of "
        "one type, pin a name for the runner type, the same in the jobs that save and compare: "
        "--distperf-env-name NAME (ini distperf_env_name)")
    # an entry of another world size or thread count is another measurement: no warning
    four = cpu_env("Intel Xeon 8370C", world=4)
    assert envkey.save_warnings(four, environments, [bl.environment_id(epyc)], "f", {}) == []
    assert envkey.save_warnings(epyc, environments, [bl.environment_id(epyc)], "f", {}) == []


def test_not_comparable_with_the_same_runner_type_on_another_machine_advises_a_name(
        tmp_path: Path) -> None:
    path = tmp_path / "test_x.toml"
    save(path, cpu_env())
    file = bl.load(path)
    assert file is not None
    xeon = cpu_env("Intel Xeon 8370C")
    j = judged(file, xeon)
    stored = (file.environments(), file.test_environments("test_a"))
    (verdict,) = envkey.with_pin_advice(j.verdicts(), *stored, xeon)
    assert verdict.verdict == NOT_COMPARABLE
    assert "device_model 'AMD EPYC 7763' there, 'Intel Xeon 8370C' here" in verdict.detail
    assert verdict.detail.endswith("those baselines differ from this run in the machine's "
                                   "details alone: if these runners are of one type, pin a name "
                                   "for the runner type, the same in the jobs that save and "
                                   "compare: --distperf-env-name NAME (ini distperf_env_name)")
    other_world = cpu_env("Intel Xeon 8370C", world=4)
    (plain,) = envkey.with_pin_advice(judged(file, other_world).verdicts(), *stored, other_world)
    assert plain.verdict == NOT_COMPARABLE and "--distperf-env-name" not in plain.detail
    (same,) = envkey.with_pin_advice(judged(file, cpu_env()).verdicts(), *stored, cpu_env())
    assert same.verdict == "unchanged"
    nan = dataclasses.replace(verdict, metric="w.nan", detail="not a number")
    assert envkey.with_pin_advice([nan], *stored, xeon, skip={"w.nan"}) == [nan]


# -- a GPU rank's facts, read from a fake NVML -------------------------------------------------
class _NVMLError(Exception):
    pass


def fake_nvml(links: dict[int, int], *, start: bool = True, by_uuid: bool = True,
              driver: Any = b"550.54.15") -> types.SimpleNamespace:
    """NVML as nvidia-ml-py spells it: ``links`` maps each link to its state (a link not
    there answers "not supported", as NVML does past a GPU's last link)."""
    def init() -> None:
        if not start:
            raise _NVMLError("Driver Not Loaded")

    def by_id(uuid: str) -> str:
        if not by_uuid:
            raise _NVMLError("Not Found")
        return f"handle:{uuid}"

    def state(handle: str, link: int) -> int:
        if link not in links:
            raise _NVMLError("Not Supported")
        return links[link]

    calls: list[str] = []
    return types.SimpleNamespace(
        NVMLError=_NVMLError, NVML_NVLINK_MAX_LINKS=18, NVML_FEATURE_ENABLED=1, calls=calls,
        nvmlInit=init, nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlSystemGetDriverVersion=lambda: driver, nvmlDeviceGetHandleByUUID=by_id,
        nvmlDeviceGetHandleByIndex=lambda index: f"handle:{index}",
        nvmlDeviceGetNvLinkState=state)


@pytest.mark.parametrize(("links", "active"), [
    ({i: 1 for i in range(18)}, 18),  # an SXM H100 on NVSwitch
    ({0: 1, 1: 1, 2: 0, 3: 0}, 2),  # a bridged pair
    ({}, 0),  # a PCIe card: every link "not supported"
])
def test_nvml_gives_the_driver_and_the_active_nvlinks(links: dict[int, int],
                                                      active: int) -> None:
    nv = fake_nvml(links)
    assert gpu.nvml_facts(nv, 0, "GPU-1234") == {"driver_version": "550.54.15",
                                                 "nvlinks": active}
    assert nv.calls == ["shutdown"]


def test_nvml_that_does_not_start_or_find_the_uuid() -> None:
    assert gpu.nvml_facts(fake_nvml({}, start=False), 0, "GPU-1") == {}
    assert gpu.nvml_facts(fake_nvml({0: 1}, by_uuid=False, driver="560.1"), 3, "GPU-1") == {
        "driver_version": "560.1", "nvlinks": 1}


@pytest.mark.parametrize(("text", "driver"), [
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
     "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n", "550.54.15"),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build\n",
     "580.159.04"),
    ("NVRM version: NVIDIA UNIX aarch64 Kernel Module  535.104  Thu Aug 10 2023\n", "535.104"),
    ("GCC version: gcc version 12.3.0\n", ""),
    ("", ""),
])
def test_the_driver_from_procfs_where_nvml_is_missing(text: str, driver: str) -> None:
    assert gpu.driver_from_proc(text) == driver
