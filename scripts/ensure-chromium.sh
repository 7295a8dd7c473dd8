#!/usr/bin/env bash
# Make sure Debian's Chromium and its ChromeDriver are installed: the status page's
# browser test drives a real headless browser through them (selenium, with the
# driver's path given, so nothing is downloaded at test time).
set -euo pipefail

have_chromium() {
  [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]
}

if have_chromium; then
  exit 0
fi
echo "chromium or chromedriver not found; installing chromium and chromium-driver" >&2
if [ "$(id -u)" -ne 0 ]; then
  echo "error: run as root or install them yourself (apt-get install chromium chromium-driver)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# fonts-dejavu-core: the page's text renders in the screenshots with a known font.
apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core >/dev/null
have_chromium || { echo "error: chromium or chromedriver still missing after install" >&2; exit 1; }
