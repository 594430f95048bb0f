#!/usr/bin/env bash
# The whole test suite: lint, layer contracts, types, then pytest (end-to-end tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
ruff check .
lint-imports --config .importlinter
mypy sharder federation alertmanager exporter thanos
# Two workers, a whole file each (module-scoped stacks stay in one worker): the e2e tests
# mostly wait on real Prometheus/Alertmanager processes, so this halves the wall time on 2 cores.
pytest -q -n 2 --dist loadfile "$@"
