#!/usr/bin/env bash
# Run the test suite in the project's .venv: ./run_tests.sh [pytest args] (default: all).
set -euo pipefail
cd "$(dirname "$0")"
source scripts/bootstrap_venv.sh
exec python -m pytest "$@"
