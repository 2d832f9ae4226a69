"""Loaded with ``-p distperf_one_save`` into the pytester runs that save a baseline only for
its exact metrics (collective counts and bytes): a save keeps one measurement of each timing
instead of 4-6, which those runs never compare.  tests/test_baseline.py checks the saves'
own measurement counts."""

from __future__ import annotations

from judgement_patch import JudgementPatch

_PATCH = JudgementPatch({"_SAVE_MEASUREMENTS": 1, "_SAVE_MAX_MEASUREMENTS": 1})
pytest_configure = _PATCH.pytest_configure
pytest_unconfigure = _PATCH.pytest_unconfigure
