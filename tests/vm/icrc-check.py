#!/usr/bin/env python3
"""Checks the ICRC of every RoCEv2 frame (UDP port 4791) in pcap files (LINKTYPE_ETHERNET),
independently of uhca's code: zlib's CRC-32 over 8 bytes of 0xFF, the IP header, the UDP
header and the BTH with the variant fields set to all ones (docs/spec/rocev2-net.md §2), then
the rest up to the ICRC, stored least-significant byte first. Prints one line per file and
exits non-zero if any frame is not RoCEv2 or has a wrong ICRC."""
import struct
import sys
import zlib


def frames(path):
    with open(path, "rb") as f:
        data = f.read()
    magic = struct.unpack("<I", data[:4])[0]
    end = "<" if magic == 0xA1B2C3D4 else ">"
    at = 24
    while at + 16 <= len(data):
        _, _, incl, _ = struct.unpack(end + "IIII", data[at:at + 16])
        yield data[at + 16:at + 16 + incl]
        at += 16 + incl


def icrc_ok(f):
    et = struct.unpack(">H", f[12:14])[0]
    if et == 0x0800:
        ip = bytearray(f[14:34])
        ip[1] = 0xFF
        ip[8] = 0xFF
        ip[10:12] = b"\xff\xff"
        l4 = 34
    elif et == 0x86DD:
        ip = bytearray(f[14:54])
        ip[0:4] = bytes([0x6F, 0xFF, 0xFF, 0xFF])
        ip[7] = 0xFF
        l4 = 54
    else:
        return None
    udp = bytearray(f[l4:l4 + 8])
    ulen = struct.unpack(">H", udp[4:6])[0]
    udp[6:8] = b"\xff\xff"
    bth = bytearray(f[l4 + 8:l4 + 20])
    bth[4] = 0xFF
    rest = f[l4 + 20:l4 + ulen - 4]
    want = f[l4 + ulen - 4:l4 + ulen]
    crc = zlib.crc32(b"\xff" * 8 + bytes(ip) + bytes(udp) + bytes(bth) + rest)
    return struct.pack("<I", crc) == want


bad = 0
for path in sys.argv[1:]:
    n = good = 0
    for fr in frames(path):
        n += 1
        if icrc_ok(fr):
            good += 1
    print(f"{path}: {n} frames, {good} with a valid ICRC")
    if n == 0 or good != n:
        bad += 1
sys.exit(1 if bad else 0)
