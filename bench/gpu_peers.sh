#!/usr/bin/env bash
# bench/gpu_peers.sh: decentralized peers sharing one GPU, against one peer alone on it, through
# decentrain-gpt (--device cuda) as a user runs it: one peer; four in-process DiLoCo peers; two
# TCP peers (two processes) with DiLoCo. Tokens/s are the program's own "throughput:" figure
# (all of a run's tokens over its wall clock, start-up and the final evaluation included), each
# row's ratio to the lone peer's. The model: nanoGPT's shakespeare-char (6 layers, width 384,
# block 256) on the built-in corpus, B = 32, bf16 compute.
#
#   bench/gpu_peers.sh [--cli PATH] [--steps 300] [--json PATH]
#
# Without a GPU it says so and exits 0 having run nothing.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cli="$root/build/examples/decentrain-gpt"
steps=300
json="$root/bench/results/gpu_peers.json"
while [ $# -gt 0 ]; do
  case "$1" in
    --cli) cli="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --json) json="$2"; shift 2 ;;
    *) echo "bench/gpu_peers.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
[ -x "$cli" ] || { echo "bench/gpu_peers.sh: $cli is missing (cmake --build build --target decentrain-gpt)" >&2; exit 2; }
work=$(mktemp -d)
peer=""  # the TCP rank 1 in the background: killed, by its PID, if the script ends first
trap '[ -n "$peer" ] && kill "$peer" 2>/dev/null; rm -rf "$work"' EXIT
if ! probe=$("$cli" train --device cuda --steps 1 --eval-batches 1 --quiet 2>&1); then
  echo "bench/gpu_peers.sh: skipped, $probe"
  exit 0
fi
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || echo "a CUDA GPU")
settings=(--preset shakespeare-char --batch-size 32 --compute-dtype bf16 --steps "$steps" --eval-every 0 --eval-batches 4
          --inner-steps 50 --comm diloco --quiet --metrics '')

run() {  # run NAME LOG ARGS...: a row from the program's throughput and validation loss
  local name=$1 log=$2
  shift 2
  timeout 900 "$@" >"$log" 2>&1 || { cat "$log"; echo "bench/gpu_peers.sh: '$name' failed" >&2; exit 1; }
  local tps val
  tps=$(grep '^throughput:' "$log" | awk '{print $2}')
  val=$(grep '^val loss' "$log" | tail -n 1 | awk '{print $3}')
  echo "$name: $tps tokens/s, val loss $val" >&2
  echo "$name|$tps|$val"
}
free_port() { python3 "$root/scripts/lib/free_port.py"; }  # (below the ephemeral range: its comment says why)

rows=()
rows+=("$(run "1 peer alone" "$work/one.txt" "$cli" train --device cuda "${settings[@]}")")
rows+=("$(run "4 in-process DiLoCo peers" "$work/four.txt" "$cli" train --device cuda --peers 4 --link ideal "${settings[@]}")")
port=$(free_port)
timeout 900 "$cli" train --device cuda --listen 127.0.0.1:0 --join "127.0.0.1:$port" --rank 1 --world 2 "${settings[@]}" \
  >"$work/tcp1.txt" 2>&1 &
peer=$!
rows+=("$(run "2 TCP DiLoCo peers (2 processes)" "$work/tcp0.txt" "$cli" train --device cuda --listen "127.0.0.1:$port" --rank 0 \
  --world 2 "${settings[@]}")")
wait "$peer" || { cat "$work/tcp1.txt"; exit 1; }
peer=""
# Rank 0 reports its own peer's throughput; the pair's is twice it (both train the same steps).
IFS='|' read -r name tps val <<<"${rows[2]}"
rows[2]="$name|$(awk -v t="$tps" 'BEGIN { printf "%.0f", 2 * t }')|$val"

IFS='|' read -r _ alone _ <<<"${rows[0]}"
echo
echo "decentrain-gpt on $gpu: shakespeare-char, B = 32, T = 256, bf16, $steps steps, DiLoCo H = 50"
printf '%-36s %14s %14s %10s\n' "run" "tokens/s" "vs 1 peer" "val loss"
mkdir -p "$(dirname "$json")"
{
  echo "{\"gpu\": \"$gpu\", \"steps\": $steps, \"rows\": ["
  sep=""
  for r in "${rows[@]}"; do
    IFS='|' read -r name tps val <<<"$r"
    ratio=$(awk -v a="$tps" -v b="$alone" 'BEGIN { printf "%.2f", a / b }')
    printf '%-36s %14s %13sx %10s\n' "$name" "$tps" "$ratio" "$val" >&2
    echo "$sep{\"run\": \"$name\", \"tokens_per_s\": $tps, \"vs_alone\": $ratio, \"val_loss\": $val}"
    sep=","
  done
  echo "]}"
} 2>&1 >"$json" | cat
echo "wrote $json"
