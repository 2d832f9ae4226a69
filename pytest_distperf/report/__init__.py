"""What a run shows and writes: the terminal summary and the report files.  Pure.

The rule: modules here import the records and results (:mod:`pytest_distperf.records`,
:mod:`pytest_distperf.fixtures.results`), the analysis's findings
(:mod:`pytest_distperf.analysis`), :mod:`pytest_distperf.config` and
:mod:`pytest_distperf.common`, matplotlib inside :mod:`~pytest_distperf.report.plots`'
functions, and neither torch nor pytest: they format what is already measured and judged.

* :mod:`~pytest_distperf.report.terminal`: the summary tables and JUnit properties;
* :mod:`~pytest_distperf.report.jsonreport`: the JSON report (its schema: ``schema.json``);
* :mod:`~pytest_distperf.report.markdown`: the Markdown summary (GitHub job summary);
* :mod:`~pytest_distperf.report.plots`: PNG charts;
* :mod:`~pytest_distperf.report.export`: CSV and other exports;
* :mod:`~pytest_distperf.report.outputs`: which files a run writes, written once.
"""
