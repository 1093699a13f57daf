#!/usr/bin/python3
"""Prints a TCP port on 127.0.0.1 that was free when drawn, for a rank 0 to listen on.

Drawn at random below the kernel's ephemeral range and checked by binding it: a port found free
by binding port 0 lies inside that range, where the kernel may deal it to another program's
port-0 listener (a concurrent test's peer) before this run's rank 0 binds it, and this run's
peers would then join that one (tests/cli/test_cli.cpp's free_port says the same in C++).
"""
import random
import socket
import sys


def main():
    low = 10000
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            high = min(int(f.read().split()[0]), 65536) - 1
    except (OSError, ValueError, IndexError):
        high = 32767
    if high - low < 1000:
        sys.exit("free_port: too few ports below the ephemeral range")
    for _ in range(1000):
        port = random.randint(low, high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        print(port)
        return
    sys.exit("free_port: no port free below the ephemeral range in 1000 tries")


if __name__ == "__main__":
    main()
