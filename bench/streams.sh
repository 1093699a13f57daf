#!/usr/bin/env bash
# bench/streams.sh: one TCP stream against several, and the library's transport, on a long fat
# link: 1 Gbit/s with 50 ms each way (a 100 ms round trip) by default, TCP end to end.
#
# Three network namespaces this script creates: the sender's and the receiver's, each joined by
# a veth pair to a router namespace between them, where every forwarded packet goes through a
# TUN device that bench/tun_delay serves (bench/tun_link.sh). This kernel has no netem; the
# device paces each direction at the rate, delays it, and drops past its queue.
# MTU 9000 on every link keeps the device's packet rate (one process, two copies a packet) well
# under what it can carry at 1 Gbit/s.
#
#   bench/streams.sh [--build DIR] [--rate-mbit 1000] [--delay-ms 50] [--queue-ms 50]
#                    [--streams 1,4,8] [--library-streams 1,4] [--library-reset K,...] [--bytes 1073741824]
#                    [--sender-wmem BYTES] [--json PATH]
#
# --streams: the rows of K plain TCP connections; --library-streams: the rows of the library's
# transport, each message striped over K connections (tcp_options::streams; auto: as many as the
# measured link needs, up to 16, tcp_options::streams_from_link); --library-reset: rows
# of the library's with K connections of which the sender resets one halfway (bench/streams.cpp).
#
# --sender-wmem sets the most a sender's socket may hold unacknowledged (the third value of
# net.ipv4.tcp_wmem in the sender's namespace; Linux's default is 4 MiB, which over a 100 ms round
# trip allows at most 4 MiB / 0.1 s, about 335 Mbit/s, a stream). The receiver's window is bounded
# the same way by tcp_rmem's third value; the script prints both ends' settings.
#
# Needs root. Everything it creates is named dt-streams-* and removed on exit; without network
# namespaces or /dev/net/tun it says why and exits 0 having run nothing.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
build="$root/build"
rate=1000 delay=50 queue=50 streams=1,4,8 library_streams=1,4 library_reset="" bytes=1073741824 wmem=""
json="$root/bench/results/streams.json"
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --rate-mbit) rate="$2"; shift 2 ;;
    --delay-ms) delay="$2"; shift 2 ;;
    --queue-ms) queue="$2"; shift 2 ;;
    --streams) streams="$2"; shift 2 ;;
    --library-streams) library_streams="$2"; shift 2 ;;
    --library-reset) library_reset="$2"; shift 2 ;;
    --bytes) bytes="$2"; shift 2 ;;
    --sender-wmem) wmem="$2"; shift 2 ;;
    --json) json="$2"; shift 2 ;;
    *) echo "bench/streams.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
bench="$build/bench/bench_streams"
link="$build/bench/tun_delay"
for f in "$bench" "$link"; do
  [ -x "$f" ] || { echo "bench/streams.sh: $f is missing (cmake --build $build --target bench_streams tun_delay)" >&2; exit 2; }
done
skip() { echo "bench/streams.sh: skipped, $*"; exit 0; }
[ "$(id -u)" = 0 ] || skip "it needs root for network namespaces"
command -v ip >/dev/null || skip "ip (iproute2) is not installed"
[ -c /dev/net/tun ] || skip "there is no /dev/net/tun"

send=dt-streams-send router=dt-streams-router receive=dt-streams-receive
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  for ns in "$send" "$router" "$receive"; do ip netns del "$ns" 2>/dev/null || true; done
}
trap cleanup EXIT
cleanup
for ns in "$send" "$router" "$receive"; do
  ip netns add "$ns" 2>/dev/null || skip "network namespaces cannot be created here (ip netns add failed)"
  ip -n "$ns" link set lo up
done
ip link add dt-streams-s netns "$send" type veth peer name dt-streams-rs netns "$router"
ip link add dt-streams-r netns "$receive" type veth peer name dt-streams-rr netns "$router"
ip -n "$send" addr add 10.79.1.2/24 dev dt-streams-s
ip -n "$receive" addr add 10.79.2.2/24 dev dt-streams-r
ip -n "$router" addr add 10.79.1.1/24 dev dt-streams-rs
ip -n "$router" addr add 10.79.2.1/24 dev dt-streams-rr
for pair in "$send dt-streams-s" "$receive dt-streams-r" "$router dt-streams-rs" "$router dt-streams-rr"; do
  read -r ns dev <<< "$pair"
  ip -n "$ns" link set "$dev" mtu 9000 up
done
ip -n "$send" route add default via 10.79.1.1
if [ -n "$wmem" ]; then
  ip netns exec "$send" sysctl -qw net.ipv4.tcp_wmem="4096 16384 $wmem"
fi
echo "bench/streams.sh: the sender's tcp_wmem: $(ip netns exec "$send" sysctl -n net.ipv4.tcp_wmem);" \
     "the receiver's tcp_rmem: $(ip netns exec "$receive" sysctl -n net.ipv4.tcp_rmem)"
ip -n "$receive" route add default via 10.79.2.1
source "$root/bench/tun_link.sh"
tun_link_up "$router" dt-streams-tun 9000 "dt-streams-rs dt-streams-rr" \
  "$link" --rate-mbit "$rate" --delay-ms "$delay" --queue-ms "$queue" || exit 1

echo "bench/streams.sh: $rate Mbit/s, $delay ms each way, a queue of $queue ms (bench/tun_delay); $bytes bytes a row"
common=(--address 10.79.2.2:7600 --streams "$streams" --library-streams "$library_streams" --library-reset "$library_reset" --bytes "$bytes")
# Each end is bounded: every row (the plain ones and the library's) at 4 MiB per round trip or a
# twentieth of the rate, whichever is less, plus a minute.
limit=$(awk -v b="$bytes" -v r="$rate" -v d="$delay" -v s="$streams" -v l="$library_streams" -v x="$library_reset" 'BEGIN {
  rows = split(s, parts, ",") + split(l, parts, ",") + split(x, parts, ","); per_s = r * 1e6 / 8 / 20; w = 4194304 / (2 * d / 1000 + 0.001)
  if (w < per_s) per_s = w
  printf "%d", rows * (b / per_s + 60) }')
ip netns exec "$receive" timeout "$limit" "$bench" --role receive "${common[@]}" --link-mbit "$rate" --json "$json" &
receiver=$!
pids+=($receiver)
sleep 0.5
ip netns exec "$send" timeout "$limit" "$bench" --role send "${common[@]}" &
sender=$!
pids+=($sender)
wait "$sender"
wait "$receiver"
echo "bench/streams.sh: wrote $json"
