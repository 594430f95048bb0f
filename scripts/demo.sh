#!/usr/bin/env bash
# The main job on the bundled example: render every child Prometheus config for the
# example federation and check each with promtool.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
gpufed render --spec examples/federation.yaml --inventory examples/inventory.yaml --out out/ "$@"
