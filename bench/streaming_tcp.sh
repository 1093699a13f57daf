#!/usr/bin/env bash
# bench/streaming_tcp.sh: bench/streaming's setting over real TCP between processes, on a link
# slowed by the kernel, beside the simulator's figure for the same link.
#
# Two peers (two cores: one process and one compute thread each), each in a network namespace
# this script creates, joined by a veth pair whose two ends are shaped: `tc netem` (delay and
# rate) where the kernel has it; else, where bench/tun_delay is built, through a router namespace
# whose packets all pass bench/tun_delay (rate and delay, TCP end to end, as bench/streams.sh
# sets up); else `tc tbf` for the rate and bench/delay_relay.py for the delay (each peer listens
# on 127.0.0.1 behind a relay in its namespace that holds every byte the latency in each
# direction, and advertises the relay's address; the relay terminates TCP, so the peers' own
# connections see no round trip). --shaper picks one. Without namespaces or any of them the
# script says why and exits 0 having run nothing. The link's rate is bench_streaming's: one f32 all-reduce of the model = --ratio
# (20) inner steps, measured by its own run first.
#
#   bench/streaming_tcp.sh [--build DIR] [--steps 300] [--rows diloco:identity,streaming-7-5:fp4,...]
#                          [--shaper netem|tun|tbf] [--json PATH]
#
# A row ending in -sized (streaming-7-5-sized) runs over TCP with --sized-to-speed: the peer whose
# core runs faster takes more inner steps instead of waiting at the exchanges; its simulated
# figure is the row's without it (the simulator's two peers are equal: sizing changes nothing).
#
# Needs root (namespaces, tc). Everything it creates is named dt-stream-* and removed on exit.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
build="$root/build"
steps=300
rows="diloco:identity,streaming-7-5:identity,diloco:fp4,streaming-7-5:fp4"
json="$root/bench/results/streaming_tcp.json"
latency_ms=10
wanted=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --rows) rows="$2"; shift 2 ;;
    --json) json="$2"; shift 2 ;;
    --shaper) wanted="$2"; shift 2 ;;
    *) echo "bench/streaming_tcp.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
cli="$build/examples/decentrain-gpt"
bench="$build/bench/bench_streaming"
tun_delay="$build/bench/tun_delay"
case "$wanted" in ""|netem|tun|tbf) ;; *) echo "bench/streaming_tcp.sh: --shaper takes netem, tun or tbf, got '$wanted'" >&2; exit 2 ;; esac
data="$root/../shared/data/tinyshakespeare.txt"
for f in "$cli" "$bench"; do
  [ -x "$f" ] || { echo "bench/streaming_tcp.sh: $f is missing (cmake --build $build --target decentrain-gpt bench_streaming)" >&2; exit 2; }
done

skip() { echo "bench/streaming_tcp.sh: skipped, $*"; exit 0; }
[ "$(id -u)" = 0 ] || skip "it needs root for network namespaces and tc"
command -v ip >/dev/null && command -v tc >/dev/null || skip "ip and tc (iproute2) are not installed"

ns0=dt-stream-0 ns1=dt-stream-1 nsr=dt-stream-router
addr0=10.77.0.1 addr1=10.77.0.2
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for ns in "$ns0" "$ns1" "$nsr"; do ip netns del "$ns" 2>/dev/null || true; done
}
trap cleanup EXIT
cleanup
ip netns add "$ns0" 2>/dev/null || skip "network namespaces cannot be created here (ip netns add failed)"
ip netns add "$ns1"
ip link add dt-stream-a netns "$ns0" type veth peer name dt-stream-b netns "$ns1" ||
  skip "veth pairs cannot be created here"
ip -n "$ns0" addr add $addr0/24 dev dt-stream-a
ip -n "$ns1" addr add $addr1/24 dev dt-stream-b
for ns in "$ns0" "$ns1"; do ip -n "$ns" link set lo up; done
ip -n "$ns0" link set dt-stream-a up
ip -n "$ns1" link set dt-stream-b up

# Which shaper: netem (delay + rate), tun (bench/tun_delay) or tbf (rate, with delay_relay.py).
# Probed before the rate is known.
has_netem=0 has_tbf=0 has_tun=0
if ip netns exec "$ns0" tc qdisc add dev dt-stream-a root netem delay 1ms 2>/dev/null; then
  has_netem=1
  ip netns exec "$ns0" tc qdisc del dev dt-stream-a root
fi
if ip netns exec "$ns0" tc qdisc add dev dt-stream-a root tbf rate 1mbit burst 32kb latency 1s 2>/dev/null; then
  has_tbf=1
  ip netns exec "$ns0" tc qdisc del dev dt-stream-a root
fi
[ -x "$tun_delay" ] && [ -c /dev/net/tun ] && has_tun=1
shaper="$wanted"
if [ -z "$shaper" ]; then
  if [ $has_netem = 1 ]; then shaper=netem; elif [ $has_tun = 1 ]; then shaper=tun; elif [ $has_tbf = 1 ]; then shaper=tbf
  else skip "no netem or tbf qdisc in this kernel, and no bench/tun_delay (cmake --build $build --target tun_delay) or /dev/net/tun"; fi
fi
case "$shaper" in
  netem) [ $has_netem = 1 ] || skip "this kernel has no netem qdisc" ;;
  tun) [ $has_tun = 1 ] || skip "$tun_delay is not built or there is no /dev/net/tun" ;;
  tbf)
    [ $has_tbf = 1 ] || skip "this kernel has no tbf qdisc"
    command -v python3 >/dev/null || skip "python3 (for bench/delay_relay.py) is missing"
    echo "bench/streaming_tcp.sh: shaping the rate with tbf, the delay with bench/delay_relay.py in front of each peer" ;;
esac
if [ "$shaper" = tun ]; then
  # Each peer on a link of its own to a router namespace, whose forwarded packets all go through
  # the TUN device bench/tun_delay serves (bench/tun_link.sh, once the rate is known).
  ip -n "$ns0" link del dt-stream-a
  ip netns add "$nsr"
  ip -n "$nsr" link set lo up
  ip link add dt-stream-a netns "$ns0" type veth peer name dt-stream-ra netns "$nsr"
  ip link add dt-stream-b netns "$ns1" type veth peer name dt-stream-rb netns "$nsr"
  addr0=10.77.1.1 addr1=10.77.2.1
  ip -n "$ns0" addr add $addr0/24 dev dt-stream-a
  ip -n "$ns1" addr add $addr1/24 dev dt-stream-b
  ip -n "$nsr" addr add 10.77.1.254/24 dev dt-stream-ra
  ip -n "$nsr" addr add 10.77.2.254/24 dev dt-stream-rb
  for pair in "$ns0 dt-stream-a" "$ns1 dt-stream-b" "$nsr dt-stream-ra" "$nsr dt-stream-rb"; do
    read -r ns dev <<< "$pair"
    ip -n "$ns" link set "$dev" up
  done
  ip -n "$ns0" route add default via 10.77.1.254
  ip -n "$ns1" route add default via 10.77.2.254
fi

# The simulator's rows first: they measure the step and so the link's rate.
tmp="$(mktemp -d)"
sim_rows="" sim_codecs=""
IFS=',' read -r -a specs <<< "$rows"
for spec in "${specs[@]}"; do
  row="${spec%%:*}" codec="${spec#*:}"
  "$bench" --peers 2 --steps "$steps" --rows "${row%-sized}" --codecs "$codec" --latency-ms "$latency_ms" \
    --json "$tmp/sim-$row-$codec.json" > "$tmp/sim-$row-$codec.txt" 2>&1
done
first="${specs[0]}"
rate_mb=$(sed -n 's/.*links [0-9.]* ms, \([0-9.]*\) MB\/s.*/\1/p' "$tmp/sim-${first%%:*}-${first#*:}.txt")
[ -n "$rate_mb" ] || { echo "bench/streaming_tcp.sh: could not read the link rate from bench_streaming" >&2; cat "$tmp/sim-${first%%:*}-${first#*:}.txt" >&2; exit 1; }
rate_bps=$(python3 -c "print(int(float('$rate_mb') * 1e6))")
if [ "$shaper" != tun ]; then
  for pair in "$ns0 dt-stream-a" "$ns1 dt-stream-b"; do
    read -r ns dev <<< "$pair"
    if [ "$shaper" = netem ]; then
      ip netns exec "$ns" tc qdisc add dev "$dev" root netem delay "${latency_ms}ms" rate "${rate_bps}bps" limit 100000
    else
      ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "${rate_bps}bps" burst 64kb latency 10s
    fi
  done
fi
if [ "$shaper" = tun ]; then
  # (a queue of 10 s, as tbf's above: the rows measure waiting, not drops)
  source "$root/bench/tun_link.sh"
  tun_link_up "$nsr" dt-stream-tun 1500 "dt-stream-ra dt-stream-rb" "$tun_delay" \
    --rate-mbit "$(python3 -c "print(float('$rate_mb') * 8)")" --delay-ms "$latency_ms" --queue-ms 10000 || exit 1
  relays=("${pids[@]}")
  delay_how="by bench/tun_delay, TCP end to end"
elif [ "$shaper" = tbf ]; then
  for pair in "$ns0 $addr0" "$ns1 $addr1"; do
    read -r ns address <<< "$pair"
    ip netns exec "$ns" python3 "$root/bench/delay_relay.py" "$address:29511" 127.0.0.1:29511 "$latency_ms" &
    pids+=($!)
  done
  relays=("${pids[@]}")
  sleep 0.5
  delay_how="by bench/delay_relay.py"
else
  relays=()
  delay_how="by netem"
fi
echo "link: $shaper, $rate_mb MB/s each way, ${latency_ms} ms added delay each way ($delay_how)"

# The same rows over TCP: the recipe of bench/shakespeare_recipe.hpp on the command line.
recipe=(--data "$data" --n-layer 4 --n-head 4 --n-embd 128 --block-size 64 --batch-size 12 --lr 1e-3 --min-lr 1e-4
        --warmup $((steps / 10 < 100 ? steps / 10 : 100)) --beta2 0.99 --weight-decay 0.1 --grad-clip 1 --dropout 0
        --steps "$steps" --eval-every 0 --eval-batches 25 --threads 1 --metrics '' --inner-steps 50)
policy_args() {  # row -> CLI flags
  case "$1" in
    *-sized) echo "$(policy_args "${1%-sized}") --sized-to-speed" ;;
    diloco) echo "--comm diloco" ;;
    diloco-overlap) echo "--comm diloco --overlap 5" ;;
    diloco-eager) echo "--comm diloco --eager" ;;
    streaming-*-eager) p="${1#streaming-}"; echo "--comm streaming-diloco --fragments ${p%%-*} --eager" ;;
    streaming-*) p="${1#streaming-}"; echo "--comm streaming-diloco --fragments ${p%%-*} --overlap ${p#*-} --mix 0.5" ;;
    *) echo "bench/streaming_tcp.sh: no CLI flags for row '$1'" >&2; exit 2 ;;
  esac
}
printf '%-16s %-9s %10s %12s %12s %10s %10s %10s %10s\n' row codec "sim util%" "tcp util% 0" "tcp util% 1" "sim loss" "tcp loss" "tcp MB" "tcp s"
mkdir -p "$(dirname "$json")"
echo "[" > "$json.tmp"
n=0
for spec in "${specs[@]}"; do
  row="${spec%%:*}" codec="${spec#*:}"
  read -r -a flags <<< "$(policy_args "$row")"
  out0="$tmp/tcp-$row-$codec-0.txt" out1="$tmp/tcp-$row-$codec-1.txt"
  # Behind relays, a peer listens on 127.0.0.1 and advertises its relay's address.
  if [ "$shaper" = tbf ]; then at0=(--listen 127.0.0.1:29511 --advertise $addr0) at1=(--listen 127.0.0.1:29511 --advertise $addr1)
  else at0=(--listen $addr0:29511) at1=(--listen $addr1:29511); fi
  ip netns exec "$ns0" timeout 900 "$cli" train "${recipe[@]}" "${flags[@]}" --codec "$codec" \
    "${at0[@]}" --rank 0 --world 2 > "$out0" 2>&1 &
  runs=($!)
  sleep 0.5
  ip netns exec "$ns1" timeout 900 "$cli" train "${recipe[@]}" "${flags[@]}" --codec "$codec" \
    "${at1[@]}" --join $addr0:29511 --rank 1 --world 2 > "$out1" 2>&1 &
  runs+=($!)
  pids=("${relays[@]}" "${runs[@]}")
  status=0
  for p in "${runs[@]}"; do wait "$p" || status=$?; done
  pids=("${relays[@]}")
  if [ "$status" != 0 ]; then echo "bench/streaming_tcp.sh: row $row $codec failed over TCP:" >&2; tail -20 "$out0" "$out1" >&2; exit 1; fi
  # The summary row of peer 0: peer, val loss, MB sent, MB received, net wait, compute, clock, util %.
  read -r _ tcp_loss tcp_mb _ _ _ tcp_clock tcp_util _ < <(grep -E '^0 +[0-9]' "$out0" | tail -1)
  # (both peers: the faster waits for the slower at the exchanges, which the simulator's equal
  # peers never do)
  read -r _ _ _ _ _ _ _ tcp_util1 _ < <(grep -E '^1 +[0-9]' "$out1" | tail -1)
  sim=$(python3 -c "import json; r = json.load(open('$tmp/sim-$row-$codec.json'))[0]; print(100 * r['utilisation'], r['val_loss'], r['simulated_s'])")
  read -r sim_util sim_loss sim_s <<< "$sim"
  printf '%-16s %-9s %10.1f %12.1f %12.1f %10.4f %10.4f %10.1f %10.1f\n' "$row" "$codec" "$sim_util" "$tcp_util" "$tcp_util1" "$sim_loss" "$tcp_loss" "$tcp_mb" "$tcp_clock"
  [ $n -gt 0 ] && echo "," >> "$json.tmp"
  printf '  {"row": "%s", "codec": "%s", "steps": %s, "peers": 2, "shaper": "%s", "link_mb_per_s": %s, "latency_ms": %s, "simulated_utilisation": %s, "tcp_utilisation": %s, "tcp_utilisation_peer1": %s, "simulated_val_loss": %s, "tcp_val_loss": %s, "simulated_s": %s, "tcp_s": %s, "tcp_mb_sent": %s}' \
    "$row" "$codec" "$steps" "$shaper" "$rate_mb" "$latency_ms" "$(python3 -c "print($sim_util / 100)")" \
    "$(python3 -c "print($tcp_util / 100)")" "$(python3 -c "print($tcp_util1 / 100)")" "$sim_loss" "$tcp_loss" "$sim_s" "$tcp_clock" "$tcp_mb" >> "$json.tmp"
  n=$((n + 1))
done
printf '\n]\n' >> "$json.tmp"
mv "$json.tmp" "$json"
rm -rf "$tmp"
echo "rows written to $json"
