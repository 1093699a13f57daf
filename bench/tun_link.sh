# bench/tun_link.sh, sourced by bench/streams.sh and bench/streaming_tcp.sh: a link through
# bench/tun_delay in a router namespace, TCP end to end, where the kernel has no netem.
#
#   tun_link_up ROUTER DEVICE MTU "IN_DEV ..." TUN_DELAY [its options other than --dev]
#
# Starts TUN_DELAY in namespace ROUTER serving the TUN device DEVICE (appending its PID to the
# caller's `pids` array, which the caller's cleanup kills), and routes every packet that comes in
# from the IN_DEVs (the router's ends of the veth pairs to the peers) to the device; what the
# device gives back goes out by the main table. Packets come back from the device with their own
# source addresses, so the router filters no reverse paths. Returns non-zero, saying why, when
# the device does not appear.
tun_link_up() {
  local router="$1" device="$2" mtu="$3" ins="$4"
  shift 4
  ip netns exec "$router" "$@" --dev "$device" &
  pids+=($!)
  for _ in $(seq 100); do ip -n "$router" link show "$device" >/dev/null 2>&1 && break; sleep 0.05; done
  ip -n "$router" link show "$device" >/dev/null 2>&1 || { echo "bench/tun_link.sh: $1 made no device $device" >&2; return 1; }
  ip -n "$router" link set "$device" mtu "$mtu" up
  ip netns exec "$router" sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0 \
    "net.ipv4.conf.$device.rp_filter=0"
  ip -n "$router" route add default dev "$device" table 100
  local in
  for in in $ins; do ip -n "$router" rule add iif "$in" lookup 100; done
}
