"""The rank processes: start them, send them work, gather replies, clear what they leave.

The rule: modules here import the rank side's entry point (:mod:`pytest_distperf.rank`),
:mod:`pytest_distperf.records` and :mod:`pytest_distperf.common`, and nothing else of
pytest-distperf; what to run comes from the caller as a function and its arguments.

* :mod:`~pytest_distperf.pool.launcher`: the pool of spawned ranks (``RankPool``), replies,
  timeouts and respawns;
* :mod:`~pytest_distperf.pool.torchrun`: the same engine under ``torchrun``, no pool;
* :mod:`~pytest_distperf.pool.ranklogs`: each rank's log, read back for errors;
* :mod:`~pytest_distperf.pool.leftovers`: rank processes of an earlier session, found and
  stopped.
"""
