#!/usr/bin/env bash
# The main job: the whole federation live on this machine (`gpufed demo`): a simulated
# GPU fleet registering with the controller, child Prometheus servers, the master with
# the rule pack, an Alertmanager HA pair and the DingTalk relay. Ctrl-C stops all of it.
# Flags pass through, e.g. `bash scripts/demo.sh --nodes 500 --duration 120 --json`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
. scripts/stack_path.sh  # Prometheus 3.x (GPUFED_STACK=2 for 2.53.3)
exec gpufed demo "$@"
