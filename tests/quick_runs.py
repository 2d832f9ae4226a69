"""For the tests that start pytest themselves (not through pytester): the environment that
loads tests/pytester_plugins/distperf_no_pauses.py into the run, as the root conftest's
pytester fixture does, the option that makes a save keep one measurement of each timing
(tests/pytester_plugins/distperf_one_save.py), for saves whose timings no test compares, and
the one that keeps torch._dynamo out of the fork server of a run that trains no model
(distperf_no_dynamo.py); and :func:`pytest_here`, a pytest run in a folder of one's own, in
this process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

PLUGINS = Path(__file__).parent / "pytester_plugins"
ONE_SAVE = ("-p", "distperf_one_save")
#: For a run in a new process that trains no model: no torch._dynamo in the fork server
#: (tests/pytester_plugins/distperf_no_dynamo.py).
NO_DYNAMO = ("-p", "distperf_no_dynamo")
#: Plugins of the outer suite that a run of the plugin never uses: 0.8 s a start.
UNUSED = ("hypothesispytest", "benchmark", "anyio")
#: What an xdist worker of the suite has in its environment, which places its ranks.
XDIST = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT")
#: The variables :func:`quick_env` sets for a run.
SET = ("PYTHONPATH", "PYTEST_PLUGINS", "PYTEST_ADDOPTS")


def quick_env(base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """``base`` (os.environ by default) and ``extra``, with the plugins' folder on
    PYTHONPATH, the no-pauses plugin loaded, the unused plugins off and gloo's CPU ranks."""
    env = dict(os.environ if base is None else base)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(PLUGINS), path)))
    env["PYTEST_PLUGINS"] = "distperf_no_pauses"
    for key in XDIST:  # a run the tests start is not one of the suite's xdist workers
        env.pop(key, None)
    # gloo unless a test asks for another backend: on a machine with fewer GPUs than a run's
    # --gpus, auto is a usage error, and the suite's runs are CPU runs
    env["PYTEST_ADDOPTS"] = " ".join([*(f"-p no:{name}" for name in UNUSED),
                                      "--distperf-backend", "gloo"])
    env.update(extra)
    return env


def not_under(folder: Path | str) -> Callable[[str], bool]:
    """Whether a module of ``sys.modules`` stays after a run in this process: all but those
    imported from ``folder`` (torch cannot be imported twice; the run's test modules must be
    imported afresh by the next run)."""
    root = str(folder)

    def keep(name: str) -> bool:
        return not (getattr(sys.modules.get(name), "__file__", None) or "").startswith(root)

    return keep


def pytest_here(folder: Path, *args: str, umask: int | None = None,
                **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m pytest *args`` in ``folder`` with :func:`quick_env`'s variables and
    ``env``, run in this process as the root conftest's pytester runs it (no new Python, no
    import of torch, the fork server already up: 4-5 s less than a subprocess); what a
    subprocess gives back, stdout and stderr as the run printed them.  For a run that a
    module-scoped fixture shares, where pytester (a test's own) cannot be used."""
    import importlib

    import pytest
    from _pytest.capture import MultiCapture, SysCapture
    from _pytest.pytester import SysModulesSnapshot, SysPathsSnapshot
    from _pytest.unraisableexception import gc_collect_iterations_key

    class Quick:
        @staticmethod
        def pytest_configure(config: pytest.Config) -> None:
            # as in pytester's runs: the unraisable-exception plugin's 5 full collections
            # of this process's heap (torch's) at the end of a run take a second or more
            config.stash[gc_collect_iterations_key] = 0

    values = quick_env(**env)
    importlib.invalidate_caches()
    with pytest.MonkeyPatch.context() as patch:
        for key in (*SET, *env):
            patch.setenv(key, values[key])
        patch.chdir(folder)
        patch.syspath_prepend(str(PLUGINS))
        modules = SysModulesSnapshot(preserve=not_under(folder))
        paths = SysPathsSnapshot()
        before = os.umask(umask) if umask is not None else None
        capture = MultiCapture(in_=SysCapture(0), out=SysCapture(1), err=SysCapture(2))
        capture.start_capturing()
        try:
            code = pytest.main(list(args), plugins=[Quick()])
        finally:
            out, err = capture.readouterr()
            capture.stop_capturing()
            if before is not None:
                os.umask(before)
            paths.restore()
            modules.restore()
    return subprocess.CompletedProcess(["pytest", *args], int(code), out, err)
