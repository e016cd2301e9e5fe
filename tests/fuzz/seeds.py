#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets: corpus/<target>/<name>, a few small inputs each,
in the input format each target's source states at its top. Run from anywhere; it replaces the
files it writes and leaves others (inputs added by hand, or kept from a campaign) alone.

    tests/fuzz/seeds.py
"""
import os
import shutil
import socket
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# ---- framing: settings bytes (framing_fuzz.cpp's config_from), then the stream ----
def u16(v):
    return struct.pack("<H", v)


def framing():
    # fixed: max_message_bytes - 1, fixed_bytes - 1
    write("framing_fixed", "four-of-eight", u16(7) + u16(3) + b"abcdefghij")
    write("framing_fixed", "one-byte", u16(0) + u16(0) + b"xyz")
    # length_prefixed: max - 1, then width (bits 0-1: 1, 2, 4, 8), little (bit 2), counts itself (bit 3)
    be4 = struct.pack(">I", 5) + b"hello" + struct.pack(">I", 0) + struct.pack(">I", 3) + b"abc"
    write("framing_length_prefixed", "be4", u16(1023) + bytes([2]) + be4)
    write("framing_length_prefixed", "le2-counts-itself",
          u16(63) + bytes([1 | 4 | 8]) + struct.pack("<H", 6) + b"four" + struct.pack("<H", 2))
    write("framing_length_prefixed", "w1", u16(255) + bytes([0]) + b"\x03abc\x00\x01z")
    write("framing_length_prefixed", "be8-oversize",
          u16(15) + bytes([3]) + struct.pack(">Q", 1 << 40) + b"x")
    # line: max - 1, delimiter length - 1, delimiter
    write("framing_line", "lf", u16(63) + bytes([0]) + b"\n" + b"hello\nworld\n\npartial")
    write("framing_line", "crlf", u16(15) + bytes([1]) + b"\r\n" + b"get k\r\nset\r\r\n")
    write("framing_line", "long", u16(3) + bytes([0]) + b"\n" + b"0123456789\n")
    # memcached: max - 1, then replies
    replies = [
        b"VALUE k 0 5\r\nhello\r\nEND\r\n",
        b"VALUE a 1 1 7\r\nx\r\nVALUE b 2 0\r\n\r\nEND\r\n",
        b"STAT pid 1\r\nSTAT uptime 2\r\nEND\r\n",
        b"VA 3 f1 s3\r\nabc\r\n",
        b"HD c123 Oabc k\r\nNF\r\nEN\r\nMN\r\n",
        b"STORED\r\nNOT_FOUND\r\nDELETED\r\n42\r\nVERSION 1.6.21\r\n",
        b"SERVER_ERROR out of memory\r\nCLIENT_ERROR bad\r\nERROR\r\n",
        b"VALUE k 0 100\r\nshort",
        b"END\n",
    ]
    for i, r in enumerate(replies):
        write("framing_memcached", f"reply-{i}", u16(1023) + r)


# ---- control frames: 4-byte big-endian length, then the YAML of one message ----
def frame(body):
    b = body.encode()
    return struct.pack(">I", len(b)) + b


def control():
    msgs = {
        "hello": "{type: hello, protocol: 1, secret: change-me-0123456789, agent: echo-1, "
                 "epoch: 77, accelerator: cpu}",
        "welcome": "{type: welcome, heartbeat_interval_ms: 100, agent_timeout_ms: 1000}",
        "region-shm": "{type: region, service: echo, transport: shm, shm_name: /caracal-echo, "
                      "region_bytes: 69632, destinations: [memcached, other]}",
        "region-rdma": "{type: region, service: kv, transport: rdma, rdma_host: 10.0.0.2, "
                       "rdma_port: 7471, rdma_address: 140000000000, rdma_rkey: 4660, "
                       "region_bytes: 1048576, destinations: []}",
        "attached": "{type: attached, service: echo}",
        "heartbeat": "{type: heartbeat}",
        "bye": "{type: bye}",
        "refused": "{type: refused, service: echo, message: \"no such service\"}",
    }
    for name, body in msgs.items():
        write("control_frame", name, frame(body))
    write("control_frame", "conversation",
          frame(msgs["hello"]) + frame(msgs["region-shm"]) + frame(msgs["heartbeat"]) +
          frame(msgs["bye"]))
    write("control_frame", "oversize", struct.pack(">I", 1 << 20) + b"{type: bye}")


# ---- configurations: the example files, and the richer ones of the tests ----
SERVER_EXTRA = {
    "full": """io_threads: 3
log_level: debug
control:
  listen: 127.0.0.1:7100
  secret: 0123456789abcdef0123
  heartbeat_interval_ms: 50
  agent_timeout_ms: 500
metrics:
  listen: "[::1]:9100"
services:
  - name: echo
    max_message_bytes: 1024
    dispatch: flow_affinity
    listeners:
      - { protocol: udp, listen: 0.0.0.0:7000, error_reply: "oops" }
      - protocol: tcp
        listen: 0.0.0.0:7001
        framing: { kind: length_prefixed, prefix_bytes: 2, byte_order: little }
      - protocol: tcp
        listen: 0.0.0.0:7002
        framing: { kind: line, delimiter: "\\r\\n" }
      - { protocol: tcp, listen: 0.0.0.0:7003, framing: { kind: fixed, bytes: 64 } }
destinations:
  - name: memcached
    connect: localhost:11211
    framing: { kind: memcached }
""",
    "dpdk": """control: { listen: 127.0.0.1:0, secret: 0123456789abcdef0123 }
dpdk: { ipv4: 192.0.2.2 }
services: [ { name: s, max_message_bytes: 8, listeners: [ { protocol: udp, kind: dpdk, listen: 192.0.2.2:9 } ] } ]
""",
}


def configs():
    for name in ("echo-server", "kv-server"):
        shutil.copy(os.path.join(ROOT, "configs", name + ".yaml"),
                    os.path.join(HERE, "corpus", "server_config", name + ".yaml"))
    for name, text in SERVER_EXTRA.items():
        write("server_config", name + ".yaml", text)
    for name in ("echo-agent", "kv-agent"):
        shutil.copy(os.path.join(ROOT, "configs", name + ".yaml"),
                    os.path.join(HERE, "corpus", "agent_config", name + ".yaml"))


# ---- region headers: mqueue/include/caracal/mqueue/layout.hpp's compute_layout ----
PAGE, LINE = 4096, 256
MAGIC = 0x31514D4C43524143


def round_up(v, to):
    return (v + to - 1) // to * to


def layout(server, client, slot, cap, max_msg, rx_lines=False, tx_lines=False, epoch=7):
    queues = server + client
    control_bytes = round_up((1 + 4 * queues) * 64, PAGE)
    rings = PAGE + control_bytes
    stride = round_up(slot * cap, PAGE)
    region = rings + 2 * queues * stride
    features = line_bytes = lines_offset = line_stride = 0
    if rx_lines or tx_lines:
        features = (1 if rx_lines else 0) | (2 if tx_lines else 0)
        line_bytes = LINE
        lines_offset = region
        line_stride = (2 if rx_lines and tx_lines else 1) * round_up(cap * LINE, PAGE)
        region += queues * line_stride
    h = struct.pack("<QIIQQIIIIIIQQQQIIQQ", MAGIC, 2, PAGE, region, epoch, server, client, slot,
                    cap, max_msg, 64, PAGE, control_bytes, rings, stride, features, line_bytes,
                    lines_offset, line_stride)
    assert len(h) == 112
    return h, region


def region_header():
    shapes = {
        "one-queue": (1, 0, 64, 4, 100),
        "two-plus-client": (2, 1, 256, 8, 1000),
        "rx-lines": (1, 0, 128, 16, 500, True, False),
        "tx-lines": (1, 1, 64, 8, 200, False, True),
        "both-lines": (2, 0, 64, 2, 48, True, True),
    }
    for name, s in shapes.items():
        h, region = layout(*s)
        # mapped size, then pokes: none, or a TX tail of queue 0 moved on by one slot
        write("region_header", name, h + struct.pack("<Q", region) + bytes([0]) + b"\x10\x00" * 8)
        # the poke lands at the header page + 4 * its value: the TX tail of queue 0
        tx_tail_q0 = (1 + 3 * (s[0] + s[1])) * 64 // 4
        write("region_header", name + "-poked",
              h + struct.pack("<Q", region) + bytes([1]) + struct.pack("<II", tx_tail_q0, 1))
    h, region = layout(1, 0, 64, 4, 100)
    write("region_header", "mapped-short", h + struct.pack("<Q", region - 1))


# ---- the TX ring script (tx_ring_fuzz.cpp): shape, counts, max - 1, then steps ----
SUBMIT, PRODUCE, RAW_HEADER, RAW_TAIL, RAW_LINE, TAKE_RX, CLOSE, SERVE = range(8)


def tx_ring():
    def submit(client, queue, length):
        return bytes([SUBMIT, client, queue]) + u16(length)

    def produce(queue, length, token_pick, flags=0):
        # token: a request's (pick < 160, then its index among those in flight)
        return bytes([PRODUCE, queue]) + u16(length) + bytes([0, token_pick, flags])

    serve = bytes([SERVE])
    take = bytes([TAKE_RX, 0, 0])
    echo = (submit(0, 0, 10) + submit(1, 0, 20) + serve + take + produce(0, 10, 0) +
            produce(0, 20, 0) + serve)
    write("tx_ring", "echo", bytes([0x05, 0x00]) + u16(99) + echo)
    write("tx_ring", "echo-lines", bytes([0x35, 0x00]) + u16(99) + echo +
          produce(0, 8, 0, 0x80) + serve)
    write("tx_ring", "two-queues-client", bytes([0x09, 0x03]) + u16(200) +
          submit(0, 1, 5) + submit(2, 0, 5) + serve + bytes([TAKE_RX, 1, 0]) +
          produce(0, 5, 0) + produce(2, 7, 1) + serve + bytes([CLOSE, 1]) + serve)
    write("tx_ring", "skip-and-wrap", bytes([0x04, 0x00]) + u16(40) +
          (submit(0, 0, 40) + serve + take + produce(0, 40, 0) + serve) * 5)
    write("tx_ring", "raw", bytes([0x05, 0x00]) + u16(99) + submit(0, 0, 4) + serve +
          bytes([RAW_HEADER, 0, 0, 0]) + u16(4) + u16(0) + u16(1) + bytes([0, 0]) +
          bytes([RAW_TAIL, 0, 0, 1]) + serve)


# ---- DPDK frames: flags byte, segment cuts (u16 each), then the frame ----
def csum(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


ME_MAC = bytes([2, 0, 0, 0, 0, 2])
PEER_MAC = bytes([2, 0, 0, 0, 0, 1])
ME, PEER = "192.0.2.2", "192.0.2.1"


def udp_frame(payload, options=b"", udp_checksum=True):
    ihl = 5 + len(options) // 4
    udp_len = 8 + len(payload)
    ip = struct.pack("!BBHHHBBH4s4s", 0x40 | ihl, 0, 4 * ihl + udp_len, 1, 0x4000, 64, 17, 0,
                     socket.inet_aton(PEER), socket.inet_aton(ME)) + options
    ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
    h = struct.pack("!HHHH", 40000, 7000, udp_len, 0)
    c = 0
    if udp_checksum:
        pseudo = socket.inet_aton(PEER) + socket.inet_aton(ME) + struct.pack("!BBH", 0, 17, udp_len)
        c = csum(pseudo + h + payload) or 0xFFFF
    return ME_MAC + PEER_MAC + b"\x08\x00" + ip + struct.pack("!HHHH", 40000, 7000, udp_len, c) + payload


def arp_request():
    arp = struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 1, PEER_MAC, socket.inet_aton(PEER),
                      b"\0" * 6, socket.inet_aton(ME))
    return b"\xff" * 6 + PEER_MAC + b"\x08\x06" + arp


def dpdk():
    write("dpdk_packet", "udp", bytes([0x00]) + udp_frame(b"hello"))
    write("dpdk_packet", "udp-3-segments", bytes([0x20]) + u16(20) + u16(9) + udp_frame(b"x" * 40))
    write("dpdk_packet", "udp-options-odd", bytes([0x10]) + u16(37) +
          udp_frame(b"abc", options=b"\x01\x01\x01\x00"))
    write("dpdk_packet", "udp-no-checksum", bytes([0x00]) + udp_frame(b"", udp_checksum=False))
    write("dpdk_packet", "udp-offloaded-good", bytes([0x02 | 0x08]) + udp_frame(b"payload"))
    write("dpdk_packet", "arp", bytes([0x00]) + arp_request())
    write("dpdk_packet", "ipv6", bytes([0x00]) + ME_MAC + PEER_MAC + b"\x86\xdd" + b"\0" * 40)


if __name__ == "__main__":
    for d in ("server_config", "agent_config"):
        os.makedirs(os.path.join(HERE, "corpus", d), exist_ok=True)
    framing()
    control()
    configs()
    region_header()
    tx_ring()
    dpdk()
