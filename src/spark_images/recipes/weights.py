"""Weight bytes from a model's own headers: safetensors and GGUF (pure: bytes in, facts out).

safetensors: 8 bytes little-endian header length, then a JSON header mapping
each tensor to its dtype, shape and data_offsets within the data section.
GGUF (v2/v3): magic, version, tensor and key/value counts, the key/values
(architecture facts), then per tensor its name, dimensions, ggml type and
offset; the data section starts at the next multiple of `general.alignment`.
A header that lies (offsets past the file, a length past the file, counts no
file could hold) is refused with one line: `HeaderProblem`.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from typing import Any

SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                     "U16": 2, "U32": 4, "U64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
                     "F4": 0.5, "F6_E2M3": 0.75, "F6_E3M2": 0.75}  # fmt: skip


class HeaderProblem(ValueError):
    """A header that cannot be what it claims (one line, for the caller to name the file)."""


@dataclass
class SafetensorsShard:
    tensors: int
    data_bytes: int  # sum of every tensor's data_offsets span
    header_bytes: int
    dtypes: dict[str, int] = field(default_factory=dict)  # dtype -> bytes


def safetensors_header_length(first8: bytes, file_size: int | None) -> int:
    if len(first8) < 8:
        raise HeaderProblem(f"{len(first8)} bytes, shorter than the 8-byte header length")
    (length,) = struct.unpack("<Q", first8[:8])
    if file_size is not None and 8 + length > file_size:
        raise HeaderProblem(f"the header claims {length} bytes, more than the file's {file_size}")
    return int(length)


def parse_safetensors_header(header: bytes, file_size: int | None) -> SafetensorsShard:
    """The shard's tensors from its JSON header; every offset must lie inside the file."""
    try:
        doc = json.loads(header.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise HeaderProblem(f"the header is not JSON ({exc.__class__.__name__})") from None
    if not isinstance(doc, dict):
        raise HeaderProblem("the header is not a JSON object")
    data_size = file_size - 8 - len(header) if file_size is not None else None
    shard = SafetensorsShard(tensors=0, data_bytes=0, header_bytes=8 + len(header))
    for name, info in doc.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) and o >= 0 for o in offsets)
                and offsets[0] <= offsets[1]):
            raise HeaderProblem(f"tensor {str(name)[:80]!r} has no valid data_offsets")
        if data_size is not None and offsets[1] > data_size:
            raise HeaderProblem(f"tensor {str(name)[:80]!r} ends at {offsets[1]}, past the {data_size} data bytes of the file")
        span = offsets[1] - offsets[0]
        shard.tensors += 1
        shard.data_bytes += span
        dtype = str(info.get("dtype"))
        shard.dtypes[dtype] = shard.dtypes.get(dtype, 0) + span
    return shard


# ggml type -> (elements per block, bytes per block), as ggml's type traits define them
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
}  # fmt: skip
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
MAX_COUNT = 1 << 24  # tensors, keys or array items: far above any model (SmolLM2: 272 tensors, 49k tokens)


@dataclass
class GgufInfo:
    version: int
    tensors: int
    data_start: int
    weight_bytes: int  # from each tensor's type and dimensions
    metadata: dict[str, Any]  # scalar and string key/values (arrays: their length only)
    types: dict[str, int] = field(default_factory=dict)  # ggml type name -> bytes


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise HeaderProblem(f"the header runs past the {len(self.data)} bytes read (at byte {self.pos}, wanting {n})")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def count(self, what: str) -> int:
        n = int(self.unpack("<Q"))
        if n > MAX_COUNT:
            raise HeaderProblem(f"{what} count {n} is more than any model holds")
        return n

    def string(self) -> str:
        return self.take(self.count("string length")).decode("utf-8", "replace")

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == 8:
            return self.string()
        if kind == 9:
            inner, n = int(self.unpack("<I")), self.count("array")
            if inner in _SCALARS:  # skipped in one step: a vocabulary of scores is large
                self.take(n * struct.calcsize(_SCALARS[inner]))
            else:
                for _ in range(n):
                    self.value(inner)
            return {"array_of": inner, "length": n}
        raise HeaderProblem(f"unknown GGUF value type {kind}")


def parse_gguf(data: bytes, file_size: int) -> GgufInfo:
    """The header of a GGUF file from its first bytes (`data`, all of the header) and its size."""
    r = _Reader(data)
    if r.take(4) != b"GGUF":
        raise HeaderProblem("not a GGUF file (no GGUF magic)")
    version = int(r.unpack("<I"))
    if version not in (2, 3):
        raise HeaderProblem(f"GGUF version {version} is not 2 or 3")
    n_tensors, n_kv = r.count("tensor"), r.count("key/value")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = r.string()
        metadata[key] = r.value(int(r.unpack("<I")))
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        n_dims = int(r.unpack("<I"))
        if n_dims > 8:
            raise HeaderProblem(f"tensor {name[:80]!r} has {n_dims} dimensions")
        dims = [int(r.unpack("<Q")) for _ in range(n_dims)]
        infos.append((name, dims, int(r.unpack("<I")), int(r.unpack("<Q"))))
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise HeaderProblem(f"general.alignment {alignment!r} is not a power of two")
    data_start = -(-r.pos // alignment) * alignment
    info = GgufInfo(version=version, tensors=n_tensors, data_start=data_start, weight_bytes=0, metadata=metadata)
    for name, dims, kind, offset in infos:
        if kind not in GGML_TYPES:
            raise HeaderProblem(f"tensor {name[:80]!r} has ggml type {kind}, which this reader does not know")
        type_name, block, size = GGML_TYPES[kind]
        elements = math.prod(dims)
        nbytes = -(-elements // block) * size
        if data_start + offset + nbytes > file_size:
            raise HeaderProblem(f"tensor {name[:80]!r} ends at {data_start + offset + nbytes}, past the file's {file_size} bytes")
        info.weight_bytes += nbytes
        info.types[type_name] = info.types.get(type_name, 0) + nbytes
    return info
