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


def quick_env(base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """``base`` (os.environ by default) and ``extra``, with the plugins' folder on
    PYTHONPATH and the no-pauses plugin loaded."""
    env = dict(os.environ if base is None else base)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(PLUGINS), path)))
    env["PYTEST_PLUGINS"] = "distperf_no_pauses"
    env.update(extra)
    return env
