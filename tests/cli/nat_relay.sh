#!/usr/bin/env bash
# Four decentrain-gpt peers across network namespaces this test creates: peers 0 and 2 on a
# public network, peers 1 and 3 each in a home network behind a NAT of its own (a router
# namespace that masquerades, iptables). Nobody can dial 1 or 3; they dial 0 and 2 out through
# their NATs and reach each other through a relay (tcp/relay.hpp). The run must end with every
# peer's validation loss equal to the same run on simulated peers, and peer 3 must say it reached
# peer 1 through a relay.
#
#   tests/cli/nat_relay.sh DECENTRAIN_GPT SCRATCH_DIR
#
# Skips (exit 77) without root, network namespaces or iptables. Every namespace, interface and
# process it made is removed on exit; it kills only the processes it started, by PID.
set -euo pipefail
bin=$1
dir=$2
skip() { echo "skipped: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces and NAT rules)"
command -v ip >/dev/null || skip "needs ip (iproute2)"
command -v iptables >/dev/null || skip "needs iptables"
mkdir -p "$dir"
cd "$dir"

tag="dtn$$"
pub="${tag}p" r1="${tag}r1" r3="${tag}r3" h1="${tag}h1" h3="${tag}h3"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for ns in "$pub" "$r1" "$r3" "$h1" "$h3"; do ip netns del "$ns" 2>/dev/null || true; done
}
trap cleanup EXIT
for ns in "$pub" "$r1" "$r3" "$h1" "$h3"; do
  ip netns add "$ns" 2>/dev/null || skip "cannot create network namespaces here"
  ip -n "$ns" link set lo up
done

# link NS_A ADDR_A NS_B ADDR_B: a veth pair between two namespaces, a /24 each side.
link() {
  local a=$1 aa=$2 b=$3 ba=$4 name=$5
  ip link add "${name}a" netns "$a" type veth peer name "${name}b" netns "$b"
  ip -n "$a" addr add "$aa/24" dev "${name}a"
  ip -n "$b" addr add "$ba/24" dev "${name}b"
  ip -n "$a" link set "${name}a" up
  ip -n "$b" link set "${name}b" up
}
# The public side (10.77.1.1 and 10.77.3.1 are the public peers' host) and two homes behind NATs.
link "$pub" 10.77.1.1 "$r1" 10.77.1.2 "${tag}x"
link "$pub" 10.77.3.1 "$r3" 10.77.3.2 "${tag}y"
link "$r1" 192.168.50.1 "$h1" 192.168.50.2 "${tag}u"
link "$r3" 192.168.50.1 "$h3" 192.168.50.2 "${tag}v"  # (both homes use the same private addresses)
for n in 1 3; do
  router="${tag}r$n" home="${tag}h$n"
  ip netns exec "$router" sysctl -qw net.ipv4.ip_forward=1
  ip -n "$router" route add 10.77.0.0/16 via "10.77.$n.1"
  ip -n "$home" route add default via 192.168.50.1
  ip netns exec "$router" iptables -t nat -A POSTROUTING -s 192.168.50.0/24 -j MASQUERADE 2>/dev/null ||
    skip "iptables cannot make NAT rules in a namespace here"
done

args=(train --comm diloco --inner-steps 3 --steps 9 --batch-size 2 --block-size 16 --n-layer 1 --n-embd 32 --n-head 2
      --eval-every 0 --eval-batches 2 --threads 1 --seed 3 --metrics '')
timeout 120 "$bin" "${args[@]}" --peers 4 > in_process.txt 2>&1
join=(--join 10.77.1.1:29501 --world 4 --join-timeout-ms 30000)
ip netns exec "$pub" timeout 120 "$bin" "${args[@]}" --listen 0.0.0.0:29501 --advertise 10.77.1.1 --rank 0 --world 4 > p0.txt 2>&1 &
pids+=($!)
ip netns exec "$pub" timeout 120 "$bin" "${args[@]}" --listen 0.0.0.0:29502 --advertise 10.77.3.1 "${join[@]}" --rank 2 > p2.txt 2>&1 &
pids+=($!)
ip netns exec "$h1" timeout 120 "$bin" "${args[@]}" "${join[@]}" --rank 1 > p1.txt 2>&1 &
pids+=($!)
ip netns exec "$h3" timeout 120 "$bin" "${args[@]}" "${join[@]}" --rank 3 > p3.txt 2>&1 &
pids+=($!)
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
pids=()
want=$(grep '^val loss ' in_process.txt | tail -1)
for r in 0 1 2 3; do
  got=$(grep '^val loss ' "p$r.txt" | tail -1 || true)
  if [ "$got" != "$want" ]; then
    echo "peer $r: '$got', simulated peers: '$want'"
    status=1
  fi
done
grep -q "tcp peer 3 reaches peer 1 through the relay peer" p3.txt || { echo "peer 3 did not say it reached peer 1 through a relay"; status=1; }
if [ "$status" != 0 ]; then
  for r in 0 1 2 3; do echo "---- peer $r"; cat "p$r.txt"; done
  exit 1
fi
echo "ok: peers 1 and 3, each behind a NAT, trained with 0 and 2 and each other through a relay: $want"
