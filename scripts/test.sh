#!/usr/bin/env bash
# The whole test suite: lint, layer contracts, types, then pytest (end-to-end tests included).
#   bash scripts/test.sh [pytest args]   in the locked virtualenv ($GPUFED_VENV, default .venv)
#   bash scripts/test.sh --upgrade       the drift check: the newest versions pyproject.toml
#                                        allows, in a throwaway virtualenv
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--upgrade" ]; then
  shift
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  export GPUFED_VENV="$scratch/venv" GPUFED_UNLOCKED=1
fi
venv="${GPUFED_VENV:-.venv}"
bash scripts/bootstrap.sh
venv=$(cd "$venv" && pwd)
export PATH="$venv/bin:$PATH" VIRTUAL_ENV="$venv"
# Prometheus 3.x first on PATH; GPUFED_STACK=2 runs the e2e tests on 2.53.3 instead.
. scripts/stack_path.sh
if [ -n "${GPUFED_UNLOCKED:-}" ]; then
  echo "test: drift check on the newest allowed versions:" >&2
  # PEP 503 names, so PyYAML is pyyaml and pydantic_core is pydantic-core on both sides
  canonical() { awk -F'==' '{n = tolower($1); gsub(/[-_.]+/, "-", n); print n "==" $2}' | sort; }
  diff <(grep -E '^[A-Za-z0-9_.-]+==' requirements/dev.txt | sed 's/ .*//' | canonical) \
       <(python -m pip freeze --all --exclude-editable | grep -v "^pip==" | grep -E '^[A-Za-z0-9_.-]+==' | canonical) \
    | grep -E '^[<>]' | sed 's/^</  lock:  /; s/^>/  newest:/' >&2 || echo "  (same as the lock)" >&2
fi
ruff check .
lint-imports --config .importlinter
mypy sharder federation alertmanager exporter thanos logs webconfig
# Two workers, a whole file each (module-scoped stacks stay in one worker): the e2e tests
# mostly wait on real Prometheus/Alertmanager processes, so this halves the wall time on 2 cores.
# The slowest tests are listed at the end: the suite must stay under 20 minutes on CI's 2 cores.
pytest -q -n 2 --dist loadfile --durations=20 "$@"
