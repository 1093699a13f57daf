#!/usr/bin/env bash
# decentrain-gpt train --device cuda, run as a user would. CTest reports it skipped (77) where
# there is no GPU or the program was built without CUDA, never passed. On a GPU:
#  - four in-process DiLoCo peers on the GPU end within 0.02 of the same run on the CPU, and
#    their checkpoints resume and sample on the CPU;
#  - two TCP peers sharing the GPU end at the in-process GPU pair's loss (within 1e-4);
#  - a CPU peer and a GPU peer train together over TCP, ending within 0.02 of a CPU pair;
#  - such a pair under DiLoCo with --sized-to-speed: the GPU peer computes a larger share of the
#    run's time than with equal inner steps, and the pair still learns;
#  - a GPU index the machine lacks is refused naming --device.
#
#   tests/cli/gpu_train.sh DECENTRAIN_GPT WORK_DIR
set -uo pipefail
gpt=$(realpath "$1") work=$2
lib=$(realpath "$(dirname "$0")/../../scripts/lib")  # (before the cd below: $0 may be relative)
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
peer=""  # a TCP rank 1 running in the background: killed, by its PID, if the script ends first
trap '[ -n "$peer" ] && kill "$peer" 2>/dev/null' EXIT
fail() {
  echo "FAILED: $*"
  exit 1
}
# Runs the program with a time limit, its output in LOG; fails the test on a non-zero exit.
train() {  # train LOG ARGS...
  local log=$1
  shift
  timeout 300 "$gpt" train "$@" >"$log" 2>&1 || { cat "$log"; fail "decentrain-gpt train $* (exit $?)"; }
}
val_loss() { grep '^val loss' "$1" | tail -n 1 | awk '{print $3}'; }
near() {  # near A B TOLERANCE WHAT
  awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= t) }' ||
    fail "$4: $1 against $2 (tolerance $3)"
  echo "ok: $4: $1 against $2"
}
free_port() { python3 "$lib/free_port.py"; }  # (below the ephemeral range: its comment says why)

probe=$(timeout 120 "$gpt" train --device cuda --steps 1 --eval-batches 1 --quiet 2>&1)
case $? in
  0) ;;
  *) case $probe in
       *"no CUDA device"* | *"built without CUDA"*) echo "skipped: $probe"; exit 77 ;;
       *) fail "the probe run: $probe" ;;
     esac ;;
esac

settings=(--batch-size 8 --eval-batches 8 --seed 7 --dropout 0)
common=(--steps 60 --quiet "${settings[@]}")

# Four DiLoCo peers on one GPU against the same run on the CPU.
train gpu4.txt --device cuda --peers 4 --comm diloco --inner-steps 10 "${common[@]}" --checkpoint-dir ck --save-every 30
train cpu4.txt --device cpu --peers 4 --comm diloco --inner-steps 10 "${common[@]}"
grep -q '^throughput: .* tokens/s on cuda (4 peers' gpu4.txt || fail "the GPU run does not say it ran on cuda: $(cat gpu4.txt)"
near "$(val_loss gpu4.txt)" "$(val_loss cpu4.txt)" 0.02 "4 DiLoCo peers: GPU against CPU"
awk -v a="$(val_loss gpu4.txt)" 'BEGIN { exit !(a != "" && a < 2.5) }' ||
  fail "4 DiLoCo peers on the GPU did not learn: validation loss $(val_loss gpu4.txt), not below 2.5 (about 4 untrained)"

# The GPU run's checkpoints on the CPU: resumed for 30 more steps, and sampled.
train resumed.txt --device cpu --peers 4 --comm diloco --inner-steps 10 --steps 90 "${settings[@]}" \
  --checkpoint-dir ck --resume
grep -q 'resumed from .*step-60' resumed.txt || fail "the CPU run did not resume from the GPU's step 60: $(cat resumed.txt)"
timeout 120 "$gpt" sample --checkpoint ck --tokens 40 --seed 1 >sample.txt 2>&1 || fail "sample from the GPU run: $(cat sample.txt)"
[ "$(wc -c <sample.txt)" -ge 40 ] || fail "sample printed too little: $(cat sample.txt)"

# Two TCP peers, rank 0 on DEVICE0 writing NAME0.txt (and its metrics NAME0.jsonl), rank 1 on
# DEVICE1 writing NAME1.txt and NAME1.jsonl; ARGS (default --comm sync) for both.
tcp_pair() {  # tcp_pair NAME DEVICE0 DEVICE1 [ARGS...]
  local name=$1 d0=$2 d1=$3 port
  shift 3
  local args=("$@")
  [ ${#args[@]} -gt 0 ] || args=(--comm sync)
  port=$(free_port)
  timeout 300 "$gpt" train --device "$d1" --listen 127.0.0.1:0 --join "127.0.0.1:$port" --rank 1 --world 2 "${args[@]}" \
    "${common[@]}" --metrics "${name}{rank}.jsonl" >"${name}1.txt" 2>&1 &
  peer=$!
  train "${name}0.txt" --device "$d0" --listen "127.0.0.1:$port" --rank 0 --world 2 "${args[@]}" "${common[@]}" \
    --metrics "${name}{rank}.jsonl"
  wait "$peer" || fail "TCP rank 1 ($d1) of $name: $(cat "${name}1.txt")"
  peer=""
}
# The share of its run's time a peer computed: compute_s / clock_s at its last step (METRICS).
busy() {
  python3 -c 'import json, sys
steps = [e for e in map(json.loads, open(sys.argv[1])) if e.get("event") == "step"]
print(float(steps[-1]["compute_s"]) / float(steps[-1]["clock_s"]) if steps else -1)' "$1"
}

# Two TCP peers sharing the GPU against two in-process peers on it (sync: the same sums).
train gpu2.txt --device cuda --peers 2 --comm sync "${common[@]}"
tcp_pair tcp cuda cuda
near "$(val_loss tcp0.txt)" "$(val_loss gpu2.txt)" 1e-4 "2 TCP peers on one GPU against 2 in-process GPU peers"

# A CPU peer and a GPU peer in one run, against two CPU peers.
train cpu2.txt --device cpu --peers 2 --comm sync "${common[@]}"
tcp_pair mixed cpu cuda
near "$(val_loss mixed0.txt)" "$(val_loss cpu2.txt)" 0.02 "a CPU peer with a GPU peer against two CPU peers"

# A CPU peer and a GPU peer under DiLoCo: with equal inner steps the faster one waits at every
# round; sized to speed (--sized-to-speed) it takes more inner steps instead, and computes for a
# larger share of the run.
tcp_pair equal cpu cuda --comm diloco --inner-steps 10
tcp_pair sized cpu cuda --comm diloco --inner-steps 10 --sized-to-speed
equal_busy=$(busy equal1.jsonl) sized_busy=$(busy sized1.jsonl)
echo "the GPU peer computed $equal_busy of its time with equal inner steps, $sized_busy sized to speed" \
     "(the CPU peer: $(busy equal0.jsonl), $(busy sized0.jsonl))"
awk -v e="$equal_busy" -v s="$sized_busy" 'BEGIN { exit !(e >= 0 && s > e + 0.1) }' ||
  fail "sized to speed, the GPU peer computed $sized_busy of its time, not more than equal steps' $equal_busy + 0.1"
awk -v a="$(val_loss sized0.txt)" 'BEGIN { exit !(a != "" && a < 2.5) }' ||
  fail "the CPU and GPU peers sized to speed did not learn: validation loss $(val_loss sized0.txt)"
echo "ok: sized to speed, validation loss $(val_loss sized0.txt) (equal steps: $(val_loss equal0.txt))"

# A GPU the machine lacks.
timeout 60 "$gpt" train --device cuda:1023 --steps 1 >missing.txt 2>&1 && fail "--device cuda:1023 was accepted"
grep -q -- "--device cuda:1023: this machine has [0-9]* CUDA device" missing.txt || fail "cuda:1023: $(cat missing.txt)"
echo "ok: --device cuda:1023 refused: $(cat missing.txt)"
echo "all passed"
