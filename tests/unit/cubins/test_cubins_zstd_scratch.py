"""zstd cubin payloads inflated into one reused buffer: no proof may read an earlier one's bytes.

`fatbin._inflated` decompresses each zstd entry into its thread's scratch
buffer. The payloads here are the nvcc-compiled oracle cubins; each case
proves a good payload first, so the buffer holds a whole valid cubin when
the hostile one is read into it.
"""

from __future__ import annotations

import threading

import pytest
import zstandard

from spark_images.cubins.fatbin import (
    Budget,
    PayloadError,
    decompress_payload,
    parse_fatbin,
    verify_cubin,
)
from support.fatbins import FLAG_A, FLAG_ZSTD, container, entry
from support.paths import ORACLE_BIN

GOOD = (ORACLE_BIN / "cubins" / "k_sm121a.cubin").read_bytes()


def _zstd_fatbin(frame: bytes, declared: int) -> bytes:
    """One container of one zstd cubin entry claiming sm_121a, `declared` bytes uncompressed."""
    return container(entry(frame, sm=121, flags=FLAG_A | FLAG_ZSTD, compressed=len(frame), uncompressed=declared))


def _prove(data: bytes) -> str:
    fatbin = parse_fatbin(memoryview(data), 0, "file", len(data))
    assert fatbin is not None and len(fatbin.entries) == 1
    return verify_cubin(data, fatbin.entries[0], Budget()).target


FRAME = zstandard.ZstdCompressor().compress(GOOD)


def test_a_good_payload_proves_and_reads_back_exactly() -> None:
    data = _zstd_fatbin(FRAME, len(GOOD))
    assert _prove(data) == "sm_121a"
    fatbin = parse_fatbin(memoryview(data), 0, "file", len(data))
    assert fatbin is not None
    assert decompress_payload(data, fatbin.entries[0]) == GOOD


@pytest.mark.parametrize(
    ("frame", "declared", "error"),
    [
        (FRAME[: len(FRAME) // 2], len(GOOD), "corrupt|decompresses to"),  # cut: the buffer's tail is still the last cubin
        (FRAME, len(GOOD) - 1, rf"decompresses to {len(GOOD)}\+ bytes, the header says {len(GOOD) - 1}"),  # a frame longer than declared
        (FRAME, len(GOOD) + 64, rf"decompresses to {len(GOOD)} bytes"),  # shorter than declared
        (zstandard.ZstdCompressor().compress(GOOD[:4096]), len(GOOD), "decompresses to 4096 bytes"),
    ],
    ids=["truncated-frame", "longer-than-declared", "shorter-than-declared", "a-prefix-of-the-last-cubin"],
)
def test_a_bad_payload_after_a_good_one_is_refused(frame: bytes, declared: int, error: str) -> None:
    assert _prove(_zstd_fatbin(FRAME, len(GOOD))) == "sm_121a"  # the scratch now holds GOOD
    with pytest.raises(PayloadError, match=error):
        _prove(_zstd_fatbin(frame, declared))
    assert _prove(_zstd_fatbin(FRAME, len(GOOD))) == "sm_121a"  # and the next proof is whole again


def test_threads_inflate_into_buffers_of_their_own() -> None:
    data = _zstd_fatbin(FRAME, len(GOOD))
    bad = _zstd_fatbin(FRAME[: len(FRAME) // 2], len(GOOD))
    results: list[str] = []

    def work(payload: bytes) -> None:
        for _ in range(50):
            try:
                results.append(_prove(payload))
            except PayloadError:
                results.append("refused")

    threads = [threading.Thread(target=work, args=(p,)) for p in (data, bad, data, bad)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count("sm_121a") == 100 and results.count("refused") == 100
