#!/usr/bin/env bash
# Refreshes the dependency lock: requirements/dev.txt (runtime + dev extras + the build
# backend) and requirements/runtime.txt (what the image installs: runtime + podresources), exact versions with
# hashes, resolved for Python 3.11 from the ranges in pyproject.toml. Commit the result
# after `bash scripts/test.sh` passes on it.
set -euo pipefail
cd "$(dirname "$0")/.."
tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT
python3 -m venv "$tools/venv"
"$tools/venv/bin/python" -m pip install -q uv
uv="$tools/venv/bin/uv"
common=(--generate-hashes --python-version 3.11 --quiet "$@")
"$uv" pip compile pyproject.toml requirements/build.in --extra dev "${common[@]}" -o requirements/dev.txt
"$uv" pip compile pyproject.toml requirements/build.in --extra podresources "${common[@]}" -o requirements/runtime.txt
echo "lock: requirements/dev.txt and requirements/runtime.txt refreshed" >&2
