#!/usr/bin/env bash
# Fetches the Prometheus stack pinned in requirements/stack.lock from Debian's archive into
# .tools/stack/<line>/ (bin/ holds prometheus, promtool, prometheus-alertmanager, amtool,
# prometheus-node-exporter; line "vm" holds victoria-metrics), without touching the
# machine's own apt sources: a private sources list and lists folder under .tools/apt.
#   bash scripts/fetch_stack.sh            fetch what is missing (idempotent, offline when done)
#   bash scripts/fetch_stack.sh --print    print "line package version" of what is installed
# Every .deb's SHA-256 is checked against the lock. A pinned version that has left the
# archive is replaced by the newest of the same minor line (3.5.x stays 3.5.x), loudly, and
# the lock row is rewritten; a checksum that differs for the same version is fatal.
set -euo pipefail
cd "$(dirname "$0")/.."
lock=requirements/stack.lock
tools="${GPUFED_TOOLS:-$PWD/.tools}"
stack="$tools/stack"
want="$(sha256sum "$lock" | cut -d' ' -f1)"
if [ "${1:-}" = "--print" ]; then
  grep -v '^#' "$lock" | awk 'NF {print $1, $3, $4}'
  exit 0
fi
if [ "$(cat "$stack/.installed" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
apt_dir="$tools/apt"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/debs"
chmod 755 "$tools" "$apt_dir" "$apt_dir/debs" 2>/dev/null || true
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
mirror="${GPUFED_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
{
  echo "deb [signed-by=$keyring] $mirror trixie main"
  echo "deb [signed-by=$keyring] $mirror sid main"
} >"$apt_dir/sources.list"
apt_opts=(-o "Dir::Etc::sourcelist=$apt_dir/sources.list" -o "Dir::Etc::sourceparts=-"
          -o "Dir::State::Lists=$apt_dir/lists" -o "APT::Sandbox::User=root" -o "Debug::NoLocking=1")
echo "fetch_stack: reading trixie and sid package lists from $mirror" >&2
apt-get "${apt_opts[@]}" update -qq >/dev/null

# newest version of PACKAGE in SUITE whose upstream version starts with PREFIX (e.g. "3.5.")
newest_in_line() {
  apt-cache "${apt_opts[@]}" madison "$1" | awk -F'|' -v suite="$2" -v prefix="$3" '
    { gsub(/ /, "", $2); if (index($3, " " suite "/") && index($2, prefix) == 1) { print $2; exit } }'
}

tmp_lock="$(mktemp)"
trap 'rm -f "$tmp_lock"' EXIT
rewritten=0
while IFS= read -r row; do
  case "$row" in ''|'#'*) echo "$row" >>"$tmp_lock"; continue ;; esac
  read -r line suite package version sha <<<"$row"
  deb_name() { echo "${package}_${1/*:/}_amd64.deb"; }
  deb="$apt_dir/debs/$(deb_name "$version")"
  if [ ! -f "$deb" ] || [ "$(sha256sum "$deb" | cut -d' ' -f1)" != "$sha" ]; then
    rm -f "$deb"
    if ! (cd "$apt_dir/debs" && apt-get "${apt_opts[@]}" download -qq "$package=$version" >/dev/null 2>&1); then
      minor="$(echo "$version" | cut -d. -f1-2)."
      replacement="$(newest_in_line "$package" "$suite" "$minor")"
      if [ -z "$replacement" ]; then
        echo "fetch_stack: $package $version has left $suite and no ${minor}x is there: pick a line by hand in $lock" >&2
        exit 1
      fi
      echo "" >&2
      echo "fetch_stack: !!! $package $version has left Debian $suite; taking $replacement (same ${minor}x line) and recording it in $lock !!!" >&2
      echo "" >&2
      version="$replacement"
      deb="$apt_dir/debs/$(deb_name "$version")"
      (cd "$apt_dir/debs" && apt-get "${apt_opts[@]}" download -qq "$package=$version" >/dev/null)
      sha="$(sha256sum "$deb" | cut -d' ' -f1)"
      rewritten=1
    fi
    got="$(sha256sum "$deb" | cut -d' ' -f1)"
    if [ "$got" != "$sha" ]; then
      echo "fetch_stack: $package $version: SHA-256 $got, the lock says $sha; refusing it" >&2
      rm -f "$deb"
      exit 1
    fi
  fi
  echo "$line $suite $package $version $sha" >>"$tmp_lock"
  root="$stack/$line/root"
  mkdir -p "$root" "$stack/$line/bin"
  dpkg -x "$deb" "$root"
done <"$lock"
for line_dir in "$stack"/*/; do
  for binary in "$line_dir"root/usr/bin/*; do
    [ -f "$binary" ] && ln -sf "$binary" "$line_dir/bin/$(basename "$binary")"
  done
done
if [ "$rewritten" = 1 ]; then
  cp "$tmp_lock" "$lock"
  want="$(sha256sum "$lock" | cut -d' ' -f1)"
fi
echo "$want" >"$stack/.installed"
for line_dir in "$stack"/2 "$stack"/3; do
  echo "fetch_stack: line $(basename "$line_dir"): $("$line_dir/bin/prometheus" --version 2>&1 | head -1 | cut -d' ' -f3)," \
       "alertmanager $("$line_dir/bin/prometheus-alertmanager" --version 2>&1 | head -1 | cut -d' ' -f3)" >&2
done
