"""Figures and findings from what the ranks measured.  Pure.

The rule: modules here import the records and result types (:mod:`pytest_distperf.records`,
:mod:`pytest_distperf.fixtures.results`), :mod:`pytest_distperf.config` and
:mod:`pytest_distperf.common`, and neither torch nor pytest; they work on records and trace
files, so they are tested on synthetic and recorded data without ranks.

* :mod:`~pytest_distperf.analysis.analyzer`: step figures, load balance, scaling curves;
* :mod:`~pytest_distperf.analysis.mesh`: a step on a mesh by dimension: counts per mesh
  dimension, samples and FLOPs each counted once;
* :mod:`~pytest_distperf.analysis.pipeline`: a pipeline's bubble against its schedule's
  theory, each stage's busy time, the slowest stage;
* :mod:`~pytest_distperf.analysis.findings`: the rules that name a bottleneck and its fix;
* :mod:`~pytest_distperf.analysis.topology`: ranks by node, slow links, slow pairs and the
  ranks they point to; the ranks' devices, and whether they differ;
* :mod:`~pytest_distperf.analysis.shares`: a step timed with batch shares: the shares used,
  the imbalance before and after;
* :mod:`~pytest_distperf.analysis.hardware`: data-sheet peaks of known GPUs;
* :mod:`~pytest_distperf.analysis.traces`: the profiler's traces, merged and analysed.
"""
