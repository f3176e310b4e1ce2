#!/usr/bin/env bash
# Installs the Debian packages redrive's set-up needs, only those that are missing:
# Java 17+ and Maven (the local Kafka broker), kcat (a test talks to the broker with it),
# Chromium (the web UI's browser tests).
set -euo pipefail

missing=()
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
command -v kcat >/dev/null 2>&1 || missing+=(kcat)
# Browser tests drive Debian's Chromium through Playwright (no browser download).
[ -x /usr/bin/chromium ] || missing+=(chromium)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1; then
  sudo=(sudo)
else
  echo "redrive set-up: missing ${missing[*]} and no root or sudo to install them;" >&2
  echo "  install them with your package manager, then run make again." >&2
  exit 1
fi

echo "redrive set-up: installing ${missing[*]} with apt-get"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
