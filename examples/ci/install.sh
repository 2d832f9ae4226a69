#!/usr/bin/env bash
# Install PyTorch from $TORCH_INDEX, then pytest-distperf as $DISTPERF_PACKAGE names it (both
# set in the workflow's env). The package is not on PyPI: a placeholder still in its name is
# refused here, with what to do, before pip fails on it.
set -euo pipefail
: "${TORCH_INDEX:?set TORCH_INDEX in the workflow's env}"
: "${DISTPERF_PACKAGE:?set DISTPERF_PACKAGE in the workflow's env}"
case "$DISTPERF_PACKAGE" in
  *"<"*">"*)
    echo "::error::DISTPERF_PACKAGE has a placeholder left: '$DISTPERF_PACKAGE'; set it in" \
         "the workflow's env to the repository and tag of pytest-distperf you install"
    exit 1 ;;
esac
python -m pip install torch --index-url "$TORCH_INDEX"
python -m pip install "$DISTPERF_PACKAGE"
