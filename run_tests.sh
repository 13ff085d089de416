#!/usr/bin/env bash
# Run the test suite in the project's .venv: ./run_tests.sh [pytest args] (default: all).
set -euo pipefail
cd "$(dirname "$0")"
source scripts/bootstrap_venv.sh
python -c "import pytest" 2>/dev/null || python -m pip install --quiet pytest
exec python -m pytest "$@"
