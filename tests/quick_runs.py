"""For the tests that start pytest themselves (not through pytester): the environment that
loads tests/pytester_plugins/distperf_no_pauses.py into the run, as the root conftest's
pytester fixture does, and the option that makes a save keep one measurement of each timing
(tests/pytester_plugins/distperf_one_save.py), for saves whose timings no test compares."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

PLUGINS = Path(__file__).parent / "pytester_plugins"
ONE_SAVE = ("-p", "distperf_one_save")
#: Plugins of the outer suite that a run of the plugin never uses: 0.8 s a start.
UNUSED = ("hypothesispytest", "benchmark", "anyio")


def quick_env(base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """``base`` (os.environ by default) and ``extra``, with the plugins' folder on
    PYTHONPATH, the no-pauses plugin loaded, the unused plugins off and gloo's CPU ranks."""
    env = dict(os.environ if base is None else base)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(PLUGINS), path)))
    env["PYTEST_PLUGINS"] = "distperf_no_pauses"
    # gloo unless a test asks for another backend: on a machine with fewer GPUs than a run's
    # --gpus, auto is a usage error, and the suite's runs are CPU runs
    env["PYTEST_ADDOPTS"] = " ".join([*(f"-p no:{name}" for name in UNUSED),
                                      "--distperf-backend", "gloo"])
    env.update(extra)
    return env
