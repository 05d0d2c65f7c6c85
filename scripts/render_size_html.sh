#!/usr/bin/env bash
# Render `tpaudit size --format html` in headless Chromium and save screenshots, to check the page by eye: one for
# serving (weights + KV cache) and one for training (model states), on the bundled Qwen3-VL-30B-A3B snapshot by
# default. Needs Debian's chromium (`apt-get install -y chromium`); the page itself loads nothing from the network.
#   scripts/render_size_html.sh [OUT_DIR] [MODEL] [extra size args...]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-/tmp/tpaudit-size}
model=${2:-$here/fixtures/qwen3-vl-30b-a3b-instruct.snapshot.json.gz}
shift 2 || shift $# || true
mkdir -p "$out"
out=$(cd "$out" && pwd)
# tpaudit: $TPAUDIT, else the repository's .venv, else one on PATH, else the python3 module
if [ -n "${TPAUDIT:-}" ]; then tpaudit=$TPAUDIT
elif [ -x "$here/.venv/bin/tpaudit" ]; then tpaudit=$here/.venv/bin/tpaudit
elif command -v tpaudit >/dev/null; then tpaudit=tpaudit
else tpaudit="python3 -m tpaudit"; fi
# exit 1 only means "no option fits": the page is still written
$tpaudit size "$model" --gpu H100-80GB --tp 1,2,4,8 --context 131072 --format html -o "$out/serving.html" "$@" \
  || [ $? -eq 1 ]
$tpaudit size "$model" --gpu H100-80GB --tp 1,2,4,8 --training --activation-budget 8GiB --format html \
  -o "$out/training.html" "$@" || [ $? -eq 1 ]
for page in serving training; do
  profile=$(mktemp -d)
  chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
    --disable-component-update --disable-sync --user-data-dir="$profile" --window-size=1300,1000 \
    --screenshot="$out/$page.png" "file://$out/$page.html" 2>/dev/null
  rm -rf "$profile"
done
echo "pages: $out/serving.html $out/training.html  screenshots: $out/serving.png $out/training.png"
