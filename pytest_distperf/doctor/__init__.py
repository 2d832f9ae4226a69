"""The runner check: how noisy, how faithful and how healthy is this machine for a gate?

Run it before anyone gates on a runner, and as the first run on a new GPU machine::

    pytest --pyargs pytest_distperf.doctor --distperf --gpus 2 [--distperf-json runner.json]

It prints one page (``docs/runner.md`` shows one and how to read it): the environment and
topology, the fidelity of ``bench``, ``measure()`` and the step timer against bare loops
timed the same way, the noise floor of each kind of metric with the sentence "a 10% gate is
trustworthy here for X, not for Y", and on GPUs what NVML says (clocks, throttling, ECC,
other processes), each problem a warning with what to do.  ``--distperf-json`` keeps the
same page under ``sections.runner_check``.  ``DISTPERF_DOCTOR_QUICK=1`` runs a short
configuration (the one CI runs).

* :mod:`~pytest_distperf.doctor.plan`: how much to measure (full or quick, CPU or GPU);
* :mod:`~pytest_distperf.doctor.model`: the page as frozen data, and its JSON;
* :mod:`~pytest_distperf.doctor.loops`: the bare loops and workloads, run on the ranks as a
  user's code is;
* :mod:`~pytest_distperf.doctor.fidelity`: the plugin against the bare loops, with an A/A;
* :mod:`~pytest_distperf.doctor.floors`: repeated measurements and the change they tell;
* :mod:`~pytest_distperf.doctor.verdict_api`: the one door into the verdict room;
* :mod:`~pytest_distperf.doctor.load`: what other processes did during the check;
* :mod:`~pytest_distperf.doctor.system`: variables, CPU governor and cores, and their advice;
* :mod:`~pytest_distperf.doctor.nvml`: NVML readings and their advice;
* :mod:`~pytest_distperf.doctor.page`: every sentence the page says, built in one place.

The rule: the doctor is pytest tests of the fixtures, as a user's would be, plus the
figures a verdict states; it imports :mod:`pytest_distperf.fixtures` (and the result types),
:mod:`pytest_distperf.analysis`, :mod:`pytest_distperf.verdict` (through ``verdict_api``
only), :mod:`pytest_distperf.records`, :mod:`pytest_distperf.config` and
:mod:`pytest_distperf.common`; never the rank processes' or the pool's own modules.
"""
