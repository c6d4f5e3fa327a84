"""Fatbin containers and entries built byte by byte, fields as in the project's fatbin-format reference.

One place for the builders that the cubin proofs' unit tests and the hostile
cubin tests need: an entry (64-byte header + payload padded to 8), a zstd
cubin entry, and the 16-byte container around entries.
"""

from __future__ import annotations

import struct

import zstandard

MAGIC = b"\x50\xed\x55\xba"
FLAG_BASE = 0x1 | 0x10  # 64-bit, Linux host
FLAG_LZ4, FLAG_ZSTD, FLAG_A, FLAG_F = 0x2000, 0x8000, 0x100000, 0x200000


def entry(payload: bytes, *, sm: int, flags: int, kind: int = 2, compressed: int = 0, uncompressed: int = 0) -> bytes:
    """One fatbin entry: a cubin (kind 2, ELF ABI 8) unless `kind` says otherwise."""
    padded = payload + b"\0" * (-len(payload) % 8)
    head = struct.pack("<HHIQII", kind, 0x0101, 0x40, len(padded), compressed, 0)
    head += struct.pack("<HHI", 8 if kind == 2 else 0, 1, sm) + struct.pack("<II", 0, 0)
    head += struct.pack("<QQQ", FLAG_BASE | flags, 0, uncompressed)
    return head + padded


def zstd_cubin(payload: bytes, *, sm: int, flags: int) -> bytes:
    """A cubin entry whose payload is one zstd frame of `payload`, its sizes declared truly."""
    packed = zstandard.ZstdCompressor().compress(payload)
    return entry(packed, sm=sm, flags=flags | FLAG_ZSTD, compressed=len(packed), uncompressed=len(payload))


def container(*entries: bytes) -> bytes:
    """The fatbin container (magic, version 1, header size 0x10, entries size) around `entries`."""
    body = b"".join(entries)
    return MAGIC + struct.pack("<HHQ", 1, 0x10, len(body)) + body
