#!/usr/bin/env bash
# Make sure Java 17+ is available for Spark; install Debian's headless JRE if not.
set -euo pipefail

java_major() {
  command -v java >/dev/null 2>&1 || { echo 0; return; }
  java -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}'
}

major=$(java_major)
if [ "${major:-0}" -ge 17 ]; then
  exit 0
fi
echo "Java 17+ not found (found: ${major:-none}); installing openjdk-17-jre-headless" >&2
if [ "$(id -u)" -ne 0 ]; then
  echo "error: run as root or install Java 17+ yourself (apt-get install openjdk-17-jre-headless)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq openjdk-17-jre-headless >/dev/null
major=$(java_major)
[ "${major:-0}" -ge 17 ] || { echo "error: Java 17+ still missing after install" >&2; exit 1; }
