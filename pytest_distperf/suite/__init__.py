"""A ready-made health check of a group's collectives, run with no code of your own::

    pytest --pyargs pytest_distperf.suite --distperf --gpus 4

Sweeps every collective of :data:`pytest_distperf.fixtures.collectives.OPS` and the send/recv
bandwidth between every pair of ranks; the nccl-tests-style tables and the pair matrix are
printed in the terminal summary.  Environment variables tune it (see ``docs/collectives.md``):
``DISTPERF_SUITE_SIZES`` (e.g. ``"64KiB,1MiB,16MiB"``), ``DISTPERF_SUITE_WARMUP``,
``DISTPERF_SUITE_ITERS``, ``DISTPERF_SUITE_DTYPE``, ``DISTPERF_SUITE_PAIR_SIZE`` and
``DISTPERF_SUITE_MIN_PAIR_RATIO`` (fail when a pair is below that fraction of a typical pair).

The rule: the suite is ordinary pytest tests of the fixtures; it imports
:mod:`pytest_distperf.fixtures`, :mod:`pytest_distperf.analysis` and
:mod:`pytest_distperf.config` only, as a user's tests would.
"""
