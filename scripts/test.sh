#!/usr/bin/env bash
# The README's test command: set up .venv (scripts/setup.sh), then run the test suite.
# Fails on any failing test and when no test ran (pytest exit code 5). Extra args go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
venv="${LF_VENV:-.venv}"
"$venv/bin/python" -m pytest -p no:cacheprovider "$@"
rc=$?
if [ "$rc" = "5" ]; then
  echo "test.sh: no tests ran" >&2
  exit 1
fi
exit "$rc"
