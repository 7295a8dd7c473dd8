#!/usr/bin/env bash
# Make sure Debian's MariaDB server is installed: the MySQL sink's integration
# tests start a private mariadbd on 127.0.0.1 with a temporary data directory.
set -euo pipefail

have_mariadb() {
  command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ]
}

if have_mariadb; then
  exit 0
fi
echo "mariadbd not found; installing mariadb-server" >&2
if [ "$(id -u)" -ne 0 ]; then
  echo "error: run as root or install MariaDB yourself (apt-get install mariadb-server)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# The package's post-install may try to start a system service; tests never use it.
apt-get install -y -qq --no-install-recommends mariadb-server mariadb-client >/dev/null
have_mariadb || { echo "error: mariadbd still missing after install" >&2; exit 1; }
