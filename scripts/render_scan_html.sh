#!/usr/bin/env bash
# Render `tpaudit scan --format html` in headless Chromium and save a screenshot, to check the page by eye.
# Needs Debian's chromium (`apt-get install chromium`); the page itself loads nothing from the network.
#   scripts/render_scan_html.sh [OUT_DIR] [extra scan args...]
set -euo pipefail
out=${1:-/tmp/tpaudit-scan}
shift || true
mkdir -p "$out"
here=$(cd "$(dirname "$0")/.." && pwd)
# tpaudit: $TPAUDIT, else the repository's .venv, else one on PATH, else the python3 module
if [ -n "${TPAUDIT:-}" ]; then tpaudit=$TPAUDIT
elif [ -x "$here/.venv/bin/tpaudit" ]; then tpaudit=$here/.venv/bin/tpaudit
elif command -v tpaudit >/dev/null; then tpaudit=tpaudit
else tpaudit="python3 -m tpaudit"; fi
$tpaudit scan --tp 4 --format html -o "$out/coverage.html" "$@"
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --user-data-dir="$(mktemp -d)" --window-size=1400,2000 \
  --screenshot="$out/coverage.png" "file://$out/coverage.html" 2>/dev/null
echo "page: $out/coverage.html  screenshot: $out/coverage.png"
