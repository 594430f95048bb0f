#!/usr/bin/env bash
# The whole test suite: lint, layer contracts, types, then pytest (end-to-end tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
ruff check .
lint-imports --config .importlinter
mypy sharder federation alertmanager exporter thanos
pytest -q "$@"
