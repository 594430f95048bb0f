#!/usr/bin/env bash
# Installs what gpufed needs on a fresh Debian machine: Prometheus/Alertmanager from
# Debian (promtool, amtool and the real processes the end-to-end tests start) and a
# virtualenv in .venv with gpufed and its dev tools. Idempotent; sourced by the
# other scripts.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
if ! command -v promtool >/dev/null 2>&1 || ! command -v amtool >/dev/null 2>&1 \
   || ! command -v prometheus-alertmanager >/dev/null 2>&1; then
  echo "bootstrap: installing Debian packages prometheus prometheus-alertmanager" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq prometheus prometheus-alertmanager >/dev/null
fi

# compose/README.md's REST steps run as written (curl, jq); the chart's pod scripts run with wget.
if ! command -v curl >/dev/null 2>&1 || ! command -v jq >/dev/null 2>&1 || ! command -v wget >/dev/null 2>&1; then
  echo "bootstrap: installing Debian packages curl jq wget" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq curl jq wget >/dev/null
fi

# The web page's browser test drives Debian's chromium (playwright's own download cannot work here).
if [ ! -x /usr/bin/chromium ]; then
  echo "bootstrap: installing Debian package chromium" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv" >&2
  python3 -m venv .venv
fi
stamp=.venv/.gpufed-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "bootstrap: installing gpufed and dev tools into .venv" >&2
  log=.venv/install.log
  if ! { .venv/bin/python -m pip install --upgrade pip \
         && .venv/bin/python -m pip install -e '.[dev]'; } >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "bootstrap: pip install failed; full log in $log" >&2
    exit 1
  fi
  touch "$stamp"
fi
