#!/usr/bin/env bash
# The status page in a real browser: headless Chromium loads http://127.0.0.1:P/ of a training
# run (decentrain-gpt train --status-port 0), runs its JavaScript, and the DOM it leaves must
# show both peers in the table and a loss curve that grows between two loads; a screenshot is
# taken too. Exit 77 (CTest: skipped) where Debian's chromium is not installed.
#   status_page_browser.sh DECENTRAIN_GPT WORKDIR
set -euo pipefail
gpt=$1
work=$2
browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
  echo "skipped: no chromium (apt-get install chromium)"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work" && cd "$work"
# (at the lowest priority: it only has to take a few steps between two loads, and beside other
# tests it would take both cores for as long as this test runs)
nice -n 19 "$gpt" train --peers 2 --steps 1000000 --n-layer 2 --n-embd 64 --n-head 2 --block-size 64 --batch-size 8 \
  --eval-every 50 --eval-batches 1 --metrics '' --quiet --status-port 0 > out.txt 2>&1 &
pid=$!
trap 'kill -INT $pid 2>/dev/null || true; wait $pid 2>/dev/null || true' EXIT
url=
for _ in $(seq 100); do
  url=$(grep -o 'http://127.0.0.1:[0-9]*/' out.txt || true)
  [ -n "$url" ] && break
  sleep 0.1
done
[ -n "$url" ] || { echo "no status page address in:"; cat out.txt; exit 1; }
sleep 2
load() {  # the DOM after the page's scripts ran; root needs --no-sandbox
  timeout 60 "$browser" --headless --no-sandbox --disable-gpu --virtual-time-budget=3000 --dump-dom "$url" 2>/dev/null
}
first=$(load)
sleep 2
second=$(load)
points() { grep -o 'data-points="[0-9]*"' <<<"$1" | grep -o '[0-9]*'; }
rows=$(grep -o 'class="peer-row"' <<<"$second" | wc -l)
p1=$(points "$first")
p2=$(points "$second")
echo "peer rows: $rows; curve points: $p1, then $p2"
grep -o '<div id="summary">[^<]*' <<<"$second"
[ "$rows" -eq 2 ] || { echo "expected 2 peer rows"; exit 1; }
[ "$p1" -gt 0 ] && [ "$p2" -gt "$p1" ] || { echo "expected a curve that grows"; exit 1; }
grep -q 'peer(s), diloco, step [0-9]* of 1000000; members 0, 1' <<<"$second" || { echo "summary missing"; exit 1; }
timeout 60 "$browser" --headless --no-sandbox --disable-gpu --virtual-time-budget=3000 --window-size=1000,800 \
  --screenshot="$work/page.png" "$url" 2>/dev/null
[ "$(head -c 8 page.png | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] || { echo "no PNG screenshot"; exit 1; }
echo "screenshot: $work/page.png ($(stat -c %s page.png) bytes)"
