"""Loaded with ``-p distperf_no_dynamo`` into the runs the tests start in a process of their
own whose tests train no model (no DDP or FSDP step, which would import torch._dynamo on first
use): the ranks' fork server imports torch and the rank's module, not torch._dynamo too, so
the run's first pool waits 1-2 s less for it.  A suite's own runs, which train models on many
fresh pools, keep the preload (pytest_distperf/pool/launcher.py's PRELOAD)."""

from __future__ import annotations

import pytest

from pytest_distperf.pool import launcher


@pytest.hookimpl(tryfirst=True)  # before the plugin's pytest_configure starts the fork server
def pytest_configure(config: pytest.Config) -> None:
    launcher.PRELOAD = [name for name in launcher.PRELOAD if name != "torch._dynamo"]
