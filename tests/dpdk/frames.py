#!/usr/bin/env python3
"""Sends hand-made Ethernet frames to snic_server's DPDK port through a raw packet socket, and
checks the answers to the good ones.

    frames.py IFACE PORT_MAC SRC_IP DST_IP UDP_PORT KIND...

Each KIND sends one frame from IFACE (the kernel's end of the link) to PORT_MAC. Kinds whose
frame is good (good, ip_options, no_udp_checksum) come from a UDP socket's port, and the echo
must come back to that socket within 2 s; the others must get no answer. `oversize` expects the
listener's error reply. Prints one line per frame; exits 1 if an answer is missing or wrong.
"""
import socket
import struct
import sys

ETH_P_IP, ETH_P_ARP, ETH_P_IPV6 = 0x0800, 0x0806, 0x86DD


def csum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


IP_ID = [0]


def ip_header(src, dst, payload_len, proto=17, ihl=5, version=4, total=None, frag=0x4000,
              options=b"", checksum=None, ident=None):
    total = 4 * ihl + payload_len if total is None else total
    ident = IP_ID[0] if ident is None else ident
    h = struct.pack("!BBHHHBBH4s4s", (version << 4) | ihl, 0, total, ident, frag, 64, proto, 0,
                    socket.inet_aton(src), socket.inet_aton(dst)) + options
    c = csum(h) if checksum is None else checksum
    return h[:10] + struct.pack("!H", c) + h[12:]


def udp(src, dst, sport, dport, payload, length=None, checksum=None):
    length = 8 + len(payload) if length is None else length
    h = struct.pack("!HHHH", sport, dport, length, 0)
    if checksum is None:
        pseudo = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack("!BBH", 0, 17, 8 + len(payload))
        checksum = csum(pseudo + h + payload) or 0xFFFF
    return struct.pack("!HHHH", sport, dport, length, checksum) + payload


def main():
    iface, port_mac, src, dst, uport = sys.argv[1:6]
    kinds = sys.argv[6:]
    uport = int(uport)
    dmac = bytes.fromhex(port_mac.replace(":", ""))
    raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    raw.bind((iface, 0))
    smac = raw.getsockname()[4]
    reply_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    reply_sock.bind((src, 0))
    reply_sock.settimeout(2.0)
    sport = reply_sock.getsockname()[1]

    def eth(payload, ethertype=ETH_P_IP, to=dmac):
        return to + smac + struct.pack("!H", ethertype) + payload

    def good_udp(payload, dport=uport, **ip_kw):
        u = udp(src, dst, sport, dport, payload)
        return eth(ip_header(src, dst, len(u), **ip_kw) + u)

    failures = 0
    for i, kind in enumerate(kinds):
        IP_ID[0] = 0x1000 + i  # fragments of different frames never match
        body = f"{kind}-{i}".encode()
        expect = None  # the answer that must come back, or None for none
        if kind == "good":
            frame, expect = good_udp(body), body
        elif kind == "ip_options":  # a NOP option pads the header to 24 bytes
            u = udp(src, dst, sport, uport, body)
            frame, expect = eth(ip_header(src, dst, len(u), ihl=6, options=b"\x01" * 4) + u), body
        elif kind == "no_udp_checksum":
            u = udp(src, dst, sport, uport, body, checksum=0)
            frame, expect = eth(ip_header(src, dst, len(u)) + u), body
        elif kind == "oversize":
            frame, expect = good_udp(b"x" * 1100), b"ERR message longer than 1024 bytes"
        elif kind == "bad_ip_total_length":  # says 200 bytes, carries fewer
            u = udp(src, dst, sport, uport, body)
            frame = eth(ip_header(src, dst, len(u), total=200) + u)
        elif kind == "bad_ihl":  # a header length of 16 bytes
            u = udp(src, dst, sport, uport, body)
            frame = eth(ip_header(src, dst, len(u), ihl=4) + b"\0" * 4 + u)
        elif kind == "bad_version":
            u = udp(src, dst, sport, uport, body)
            frame = eth(ip_header(src, dst, len(u), version=6) + u)
        elif kind == "udp_length_too_long":
            u = udp(src, dst, sport, uport, body, length=8 + len(body) + 40)
            frame = eth(ip_header(src, dst, len(u)) + u)
        elif kind == "udp_length_too_short":
            u = udp(src, dst, sport, uport, body, length=4)
            frame = eth(ip_header(src, dst, len(u)) + u)
        elif kind == "bad_ip_checksum":
            u = udp(src, dst, sport, uport, body)
            frame = eth(ip_header(src, dst, len(u), checksum=0xBEEF) + u)
        elif kind == "bad_udp_checksum":
            u = udp(src, dst, sport, uport, body, checksum=0xBEEF)
            frame = eth(ip_header(src, dst, len(u)) + u)
        elif kind == "truncated_ip":  # 10 bytes of an IPv4 header
            frame = eth(ip_header(src, dst, 8)[:10])
        elif kind == "truncated_udp":  # an IPv4 packet of 24 bytes: half a UDP header
            frame = eth(ip_header(src, dst, 4) + b"\0" * 4)
        elif kind == "ethernet_only":
            frame = eth(b"")
        elif kind == "fragment_first":  # more-fragments set
            u = udp(src, dst, sport, uport, body)
            frame = eth(ip_header(src, dst, len(u), frag=0x2000) + u)
        elif kind == "fragment_later":  # offset 185 x 8 bytes
            frame = eth(ip_header(src, dst, len(body), frag=185) + body)
        elif kind in ("fragment_pair", "fragment_pair_reassembled"):
            # A whole datagram in two fragments (8 bytes, then the rest). Where the link layer
            # reassembles (af_packet's fanout group does, PACKET_FANOUT_FLAG_DEFRAG), the
            # datagram arrives whole and is answered; else both fragments are dropped.
            u = udp(src, dst, sport, uport, body)
            raw.send(eth(ip_header(src, dst, 8, frag=0x2000) + u[:8]))
            frame = eth(ip_header(src, dst, len(u) - 8, frag=1) + u[8:])
            if kind == "fragment_pair_reassembled":
                expect = body
        elif kind == "not_our_ip":
            u = udp(src, "192.0.2.99", sport, uport, body)
            frame = eth(ip_header(src, "192.0.2.99", len(u)) + u)
        elif kind == "not_our_mac":
            u = udp(src, dst, sport, uport, body)
            frame = eth(ip_header(src, dst, len(u)) + u, to=b"\x02\0\0\0\0\x99")
        elif kind == "arp_other_ip":
            arp = struct.pack("!HHBBH6s4s6s4s", 1, ETH_P_IP, 6, 4, 1, smac, socket.inet_aton(src),
                              b"\0" * 6, socket.inet_aton("192.0.2.99"))
            frame = eth(arp, ETH_P_ARP, to=b"\xff" * 6)
        elif kind == "no_listener":
            frame = good_udp(body, dport=uport + 999)
        elif kind == "icmp":
            icmp = struct.pack("!BBHHH", 8, 0, 0, 1, 1) + body
            icmp = icmp[:2] + struct.pack("!H", csum(icmp)) + icmp[4:]
            frame = eth(ip_header(src, dst, len(icmp), proto=1) + icmp)
        elif kind == "ipv6":
            frame = eth(b"\x60" + b"\0" * 39, ETH_P_IPV6)
        else:
            print(f"unknown kind {kind}", file=sys.stderr)
            return 2
        raw.send(frame)
        try:
            data, frm = reply_sock.recvfrom(4096) if expect is not None else (None, None)
        except socket.timeout:
            data = None
        if expect is None:
            print(f"{kind}: sent {len(frame)} bytes")
        elif data == expect and frm == (dst, uport):
            print(f"{kind}: sent {len(frame)} bytes, answered {data!r}")
        else:
            print(f"{kind}: sent {len(frame)} bytes, expected {expect!r}, got {data!r}")
            failures += 1
    # Nothing may answer the bad frames.
    reply_sock.settimeout(0.5)
    try:
        data, frm = reply_sock.recvfrom(4096)
        print(f"unexpected answer {data!r} from {frm}")
        failures += 1
    except socket.timeout:
        pass
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
