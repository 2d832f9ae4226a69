"""Print the tests of a pytest-distperf JSON report (--distperf-json) that lack a baseline
comparable with this run: a verdict of theirs is "no baseline" or "not comparable" (a first
run on this runner, a new test or metric, a changed environment). One pytest node id a line,
nothing when every test compared. A test that regressed is left out, and named on stderr:
saving it would make the regression its baseline.

Usage: python tests-to-save.py REPORT
"""

from __future__ import annotations

import json
import sys

UNCOMPARED = ("no baseline", "not comparable")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    path = argv[1]
    try:
        with open(path, encoding="utf-8") as f:
            tests = json.load(f)["tests"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"tests-to-save: cannot read the distperf report {path}: {exc!r}; the run that "
              f"should have written it (--distperf-json) failed before the end",
              file=sys.stderr)
        return 1
    for test in tests:
        verdicts = {v["verdict"] for v in test["verdicts"]}
        if not verdicts & set(UNCOMPARED):
            continue
        if "regressed" in verdicts:
            print(f"tests-to-save: not saving {test['nodeid']}: it regressed", file=sys.stderr)
            continue
        print(test["nodeid"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
