"""Which TCP ports a process tree listens on, and whether the network can reach them.

For tests/test_isolation.py. Listening sockets are read from /proc/<pid>/net/tcp{,6}, which
show that process's own network namespace: psutil's connection lists (psutil 7) read /proc/net,
the caller's namespace, and so miss the sockets of an isolated program.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import socket
import struct

import psutil

_TCP_LISTEN = "0A"


@dataclasses.dataclass(frozen=True)
class ListeningSocket:
    """A TCP socket in the listening state, owned by a process of the program."""

    pid: int
    process: str
    address: str
    port: int
    exposed: bool  # bound beyond loopback in a namespace that has a non-loopback interface


def listening_sockets(root_pid: int | None = None) -> list[ListeningSocket]:
    """The TCP ports `root_pid` (default: this process) and its descendants listen on."""
    root = psutil.Process(root_pid)
    found: list[ListeningSocket] = []
    for proc in [root, *root.children(recursive=True)]:
        try:
            name = proc.name()
            inodes = _socket_inodes(proc.pid)
            listeners = tcp_listeners(proc.pid)
            outside = has_non_loopback_interface(proc.pid)
        except (psutil.Error, OSError):
            continue  # gone meanwhile, or not ours to read
        for inode, (address, port) in listeners.items():
            if inode in inodes:
                exposed = outside and not _is_loopback(address)
                found.append(ListeningSocket(proc.pid, name, address, port, exposed))
    return sorted(found, key=lambda s: (s.port, s.pid))


def describe_exposure(root_pid: int | None = None) -> str:
    """One line saying which of the program's ports can be reached from the network."""
    sockets = listening_sockets(root_pid)
    exposed = [s for s in sockets if s.exposed]
    if not exposed:
        return (
            f"no node port is reachable from the network "
            f"({len(sockets)} listening on loopback or in a private network namespace)"
        )
    ports = ", ".join(f"{s.port} ({s.process} pid {s.pid})" for s in exposed)
    return f"reachable from the network without authentication: {ports}"


def tcp_listeners(pid: int) -> dict[int, tuple[str, int]]:
    """inode -> (address, port) of the listening TCP sockets in `pid`'s network namespace."""
    listeners = {}
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                rows = f.readlines()[1:]
        except FileNotFoundError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == _TCP_LISTEN:
                address_hex, port_hex = fields[1].split(":")
                address = _decode_address(address_hex, family)
                listeners[int(fields[9])] = (address, int(port_hex, 16))
    return listeners


def has_non_loopback_interface(pid: int) -> bool:
    """Whether `pid`'s network namespace has any interface besides `lo`."""
    with open(f"/proc/{pid}/net/dev") as f:
        names = [line.split(":", 1)[0].strip() for line in f.readlines()[2:]]
    return any(name != "lo" for name in names)


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _decode_address(address_hex: str, family: int) -> str:
    # /proc/net/tcp prints each 32-bit word of the address as a host-order integer; packing
    # it back in host order restores the bytes in network order.
    words = [address_hex[i : i + 8] for i in range(0, len(address_hex), 8)]
    return socket.inet_ntop(family, b"".join(struct.pack("=I", int(w, 16)) for w in words))


def _is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)
