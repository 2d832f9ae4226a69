"""Small helpers every room shares: quantiles, time intervals, atomic files, ``/proc``,
bandwidths, mesh layouts, records as plain data.

The rule: standard library only; nothing here imports anything of pytest-distperf, so any
room may import it, the rank processes included.

* :mod:`~pytest_distperf.common.quantiles`: quantiles and medians that skip missing values;
* :mod:`~pytest_distperf.common.intervals`: merge, clip and measure ``(start, end)`` spans;
* :mod:`~pytest_distperf.common.files`: file names from node ids, atomic writes;
* :mod:`~pytest_distperf.common.procs`: the process table from ``/proc`` (Linux);
* :mod:`~pytest_distperf.common.bandwidth`: nccl-tests' algbw and busbw factors;
* :mod:`~pytest_distperf.common.shares`: per-rank shares of a global batch: checked, from
  throughput, as rows;
* :mod:`~pytest_distperf.common.layout`: mesh layouts: a rank's coordinates, which batch it
  trains on, which rank counts for its group;
* :mod:`~pytest_distperf.common.names`: canonical collective and dtype names, as profilers
  and the dispatcher spell them;
* :mod:`~pytest_distperf.common.peaksites`: the blocks live at an allocator snapshot's peak,
  by the code that allocated them, and what grew between two such lists;
* :mod:`~pytest_distperf.common.plaindata`: ``to_dict``/``from_dict``, a record tree as JSON-ready
  data and back (:mod:`pytest_distperf.records` re-exports them).
"""
