"""The layer reader's fast tar header path gives exactly what tarfile's own parser gives.

`readers.layers._TarInfo.frombuf` reads common headers with one struct
unpack and hands everything else to `tarfile.TarInfo.frombuf`. Here both
read the same 512-byte blocks: every header of archives written by tarfile
in all three formats (long names, links, devices, huge ids, UTF-8, V7
directories), odd hand-made blocks, and every header of the real arm64
root file system the engine tests build from. And the layer walk (`_walk`)
meets the same members at the same data offsets as tarfile, and refuses
what a layer must not hide (corrupt or cut headers, cut data, huge pax).
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_images.readers.common import ShortRead, spool
from spark_images.readers.layers import _byte_sum, _TarInfo, _walk
from spark_images.readers.streams import ForwardStream, LayerError

ROOTFS = Path(os.environ.get("SPARK_IMAGES_TEST_CACHE", Path.home() / ".cache" / "spark-images-test")) / "rootfs-arm64.tar"
ENC, ERR = "utf-8", "surrogateescape"


def _fields(info: tarfile.TarInfo) -> dict[str, object]:
    """Every attribute tarfile keeps on a TarInfo (its __slots__), as plain data."""
    return {k: getattr(info, k, None) for k in tarfile.TarInfo.__slots__ if k != "tarfile"}


def _both(block: bytes) -> tuple[dict[str, object] | str, dict[str, object] | str]:
    def read(parse: object) -> dict[str, object] | str:
        try:
            return _fields(parse(block, ENC, ERR))  # type: ignore[operator]
        except tarfile.HeaderError as exc:
            return f"{type(exc).__name__}: {exc}"

    return read(_TarInfo.frombuf), read(tarfile.TarInfo.frombuf)


def _header_blocks(data: bytes) -> Iterator[bytes]:
    """Every header block tarfile itself reads in `data`, the extended ones (pax, GNU long
    names) included: those sit between the previous member's data and a member's header."""
    end = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar:
            while end < member.offset:  # an extended header, then its data
                block = data[end : end + tarfile.BLOCKSIZE]
                yield block
                size = int(block[124:136].split(b"\0", 1)[0].strip() or b"0", 8)
                end += tarfile.BLOCKSIZE + -(-size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
            yield data[member.offset : member.offset + tarfile.BLOCKSIZE]
            end = member.offset_data + -(-member.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE if member.isreg() else member.offset_data


def _archive(fmt: int) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=fmt, encoding=ENC) as tar:

        def add(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", **attrs: object) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.size, info.mtime, info.mode = kind, len(data), 1_700_000_000, 0o644
            for key, value in attrs.items():
                setattr(info, key, value)
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)

        add("usr/lib/python3/dist-packages/vllm/_C.abi3.so", data=b"\x7fELF" + b"x" * 600)
        add("d/" * 60 + "long-name-in-the-prefix.so", data=b"y")  # over 100 characters
        if fmt != tarfile.USTAR_FORMAT:  # ustar cannot store these
            add("n" * 300, data=b"z")  # a name no prefix split holds: pax or GNU long name
            add("l" * 20, tarfile.SYMTYPE, linkname="t" * 150)  # a link target over 100 characters
        add("usr/share/doc", tarfile.DIRTYPE, mode=0o755)
        add("usr/bin/python3", tarfile.SYMTYPE, linkname="python3.11")
        add("usr/bin/python3.11-again", tarfile.LNKTYPE, linkname="usr/bin/python3.11")
        add("dev/null", tarfile.CHRTYPE, devmajor=1, devminor=3, mode=0o666)
        add("run/fifo", tarfile.FIFOTYPE)
        add("opt/ünïcödé/файл.txt", data=b"u", uname="bénédicte", gname="équipe")
        add("opt/owner", data=b"o", uid=1000, gid=1000, uname="ubuntu", gname="ubuntu")
        if fmt != tarfile.USTAR_FORMAT:  # ustar cannot store these
            add("opt/huge-id", data=b"h", uid=2**40, gid=2**33)
            add("opt/old", data=b"o", mtime=-1_000_000)
    return raw.getvalue()


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT], ids=["ustar", "gnu", "pax"])
def test_the_fast_path_reads_every_header_tarfile_writes_as_tarfile_does(fmt: int, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = list(_header_blocks(_archive(fmt)))
    assert len(blocks) >= 9
    for block in blocks:
        ours, theirs = _both(block)
        assert ours == theirs
    # and the fast path is what read the common ones: tarfile's parser is left for the odd
    calls: list[bytes] = []
    slow = tarfile.TarInfo.frombuf.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(tarfile.TarInfo, "frombuf", classmethod(lambda cls, b, e, r: calls.append(b) or slow(cls, b, e, r)))
    for block in blocks:
        _TarInfo.frombuf(block, ENC, ERR)
    assert len(calls) < len(blocks) / 2
    if fmt == tarfile.USTAR_FORMAT:
        assert calls == []


def _with_checksum(block: bytearray, signed: bool = False, delta: int = 0) -> bytes:
    block[148:156] = b" " * 8
    total = delta + 256 + sum((b - 256 if signed and b > 127 else b) for i, b in enumerate(block) if not 148 <= i < 156)
    block[148:156] = b"%06o\0 " % (total & 0o777777) if total >= 0 else b"-%05o\0 " % -total
    return bytes(block)


def test_odd_blocks_get_tarfiles_own_answer() -> None:
    good = bytearray(next(_header_blocks(_archive(tarfile.USTAR_FORMAT))))
    bad_checksum = bytearray(good)
    bad_checksum[0] ^= 1
    junk_size = bytearray(good)
    junk_size[124:136] = b"12x4567\0    "
    odd_space = bytearray(good)
    odd_space[100:108] = b"\x1c000644\0"  # str.strip() drops \x1c, bytes.strip() does not
    base256_size = bytearray(good)
    base256_size[124:136] = b"\x80" + (123456789).to_bytes(11, "big")
    high = bytearray(good)
    high[0:3] = b"\xe9\xe9\xe9"  # bytes over 127: the signed sum differs from the unsigned one
    sparse = bytearray(good)
    sparse[156:157] = tarfile.GNUTYPE_SPARSE
    v7_dir = bytearray(good)
    v7_dir[0:100] = b"etc/".ljust(100, b"\0")
    v7_dir[156:157] = tarfile.AREGTYPE
    heavy = bytearray(good)  # a byte sum far past adler32's modulus (65521): 0xff in every free field
    for start, end in ((1, 100), (265, 329), (345, 512)):
        heavy[start:end] = b"\xff" * (end - start)
    cases = {
        "end block": bytes(512),
        "truncated": bytes(good[:300]),
        "bad checksum": bytes(bad_checksum),
        "junk in a number": _with_checksum(junk_size),
        "base-256 size": _with_checksum(base256_size),
        "a separator character before a number": _with_checksum(odd_space),
        "signed checksum": _with_checksum(high, signed=True),
        "unsigned checksum over high bytes": _with_checksum(bytearray(high)),
        "gnu sparse": _with_checksum(sparse),
        "v7 directory": _with_checksum(v7_dir),
        "the heaviest header": _with_checksum(heavy),
        "the heaviest header, checksum off by adler32's modulus": _with_checksum(heavy, delta=65521),
    }
    answers = {}
    for name, block in cases.items():
        ours, theirs = _both(block)
        assert ours == theirs, name
        answers[name] = ours
    assert isinstance(answers["bad checksum"], str) and "bad checksum" in answers["bad checksum"]
    assert isinstance(answers["end block"], str) and "EOFHeaderError" in answers["end block"]
    assert isinstance(answers["base-256 size"], dict) and answers["base-256 size"]["size"] == 123456789
    assert isinstance(answers["a separator character before a number"], dict)
    assert answers["a separator character before a number"]["mode"] == 0o644
    assert isinstance(answers["v7 directory"], dict) and answers["v7 directory"]["type"] == tarfile.DIRTYPE
    assert isinstance(answers["the heaviest header"], dict)
    assert isinstance(answers["the heaviest header, checksum off by adler32's modulus"], str)


def test_the_header_byte_sum_is_sum_exactly() -> None:
    blocks = [bytes(512), b"\xff" * 512, b"\xff" * 256 + bytes(256), os.urandom(512), os.urandom(300), b""]
    assert [_byte_sum(b) for b in blocks] == [sum(b) for b in blocks]


def test_every_header_of_the_real_arm64_root_file_system_reads_the_same() -> None:
    if not ROOTFS.is_file():
        pytest.skip(f"{ROOTFS} is not built here (`bash .ci/engine-up.sh` builds it)")
    seen = 0
    with ROOTFS.open("rb") as fh, tarfile.open(fileobj=fh, mode="r:") as tar:
        for member in tar:
            fh_pos = fh.tell()
            fh.seek(member.offset)
            block = fh.read(tarfile.BLOCKSIZE)
            fh.seek(fh_pos)
            ours, theirs = _both(block)
            assert ours == theirs, member.name
            seen += 1
    assert seen > 1000


# --- the layer walk: the same members, at the same offsets, as tarfile reads them -------------


def _walked(data: bytes) -> list[tuple[str, bytes, int, str, int]]:
    stream = ForwardStream(iter([data[i : i + 700] for i in range(0, len(data), 700)]))  # chunks cut mid-header
    return [(e.name, e.type, e.size, e.linkname, stream.tell()) for e in _walk(stream)]


def _tarfile_members(data: bytes) -> list[tuple[str, bytes, int, str, int]]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:", encoding=ENC, errors=ERR) as tar:
        return [(m.name, m.type, m.size, m.linkname, m.offset_data) for m in tar]


def _global_pax() -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "global"}) as tar:
        for name in ("a/" + "x" * 200, "b.so"):
            info = tarfile.TarInfo(name)
            info.size = 3
            tar.addfile(info, io.BytesIO(b"abc"))
    return raw.getvalue()


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT], ids=["ustar", "gnu", "pax"])
def test_the_walk_meets_every_member_where_tarfile_does(fmt: int) -> None:
    data = _archive(fmt)
    walked = _walked(data)
    assert walked == _tarfile_members(data)
    assert len(walked) >= 9 and any(len(name) >= 300 for name, *_ in walked) == (fmt != tarfile.USTAR_FORMAT)


def test_the_walk_reads_a_global_pax_header_and_the_real_root_file_system_as_tarfile_does() -> None:
    assert _walked(_global_pax()) == _tarfile_members(_global_pax())
    if ROOTFS.is_file():
        data = ROOTFS.read_bytes()
        assert _walked(data) == _tarfile_members(data)


def test_the_walk_refuses_what_a_layer_must_not_hide() -> None:
    data = _archive(tarfile.PAX_FORMAT)
    first = _tarfile_members(data)
    second_header = first[1][4] - tarfile.BLOCKSIZE
    corrupt = bytearray(data)
    corrupt[second_header + 148 : second_header + 156] = b"9999999\0"
    pax = tarfile.TarInfo("././@PaxHeader")
    pax.type, pax.size = tarfile.XHDTYPE, 2 << 30
    cases = {
        "a corrupt second header": (bytes(corrupt), "invalid header at byte"),
        "data cut inside a member": (data[: first[0][4] + 100], "ends inside"),
        "a header cut in two": (data[: second_header + 200], "truncated|ends after"),
        "a 2 GiB pax header": (pax.tobuf(format=tarfile.USTAR_FORMAT) + bytes(4096), "exceeds"),
        "a pax record that lies": (_pax_lie(), "invalid pax header record"),
        "a chain of extended headers": (_pax_chain(), "exceeds .*with those before it"),
        "a negative pax size": (_pax_member(b"13 size=-512\n"), "negative size"),
    }
    for case, (blob, words) in cases.items():
        with pytest.raises(LayerError, match=words):
            _walked(blob)
        assert case
    assert _walked(b"") == [] and _walked(bytes(1024)) == []  # an empty layer, end blocks only


def _pax_lie() -> bytes:
    records = b"99 path=short\n"
    info = tarfile.TarInfo("././@PaxHeader")
    info.type, info.size = tarfile.XHDTYPE, len(records)
    return info.tobuf(format=tarfile.USTAR_FORMAT) + records.ljust(512, b"\0") + tarfile.TarInfo("x").tobuf()


def test_a_member_spooled_across_chunks_is_its_bytes_and_a_short_one_is_refused() -> None:
    data = bytes(range(256)) * 40  # 10 240 bytes in 700-byte chunks: pieces cut at every boundary
    stream = ForwardStream(iter([data[i : i + 700] for i in range(0, len(data), 700)]))
    stream.seek(100)
    mapped = spool(stream, 9000, "m", framed=True)
    assert bytes(mapped[:]) == data[100:9100] and stream.tell() == 9100
    assert stream.read(5) == data[9100:9105]  # the stream stands right after the member
    short = ForwardStream(iter([data[:700], data[700:1000]]))
    with pytest.raises(ShortRead, match="ends 24 bytes before"):
        spool(short, 1024, "m", framed=True)


def _pax_member(records: bytes, then: bytes = b"") -> bytes:
    info = tarfile.TarInfo("././@PaxHeader")
    info.type, info.size = tarfile.XHDTYPE, len(records)
    body = records + bytes(-len(records) % tarfile.BLOCKSIZE)
    return info.tobuf(format=tarfile.USTAR_FORMAT) + body + (then or tarfile.TarInfo("x").tobuf())


def _pax_chain() -> bytes:
    """Two pax headers of 600 KiB each before one member: each under the cap, together over it."""
    record = b"comment=" + b"c" * (600 << 10) + b"\n"
    for digits in range(1, 9):
        line = b"%d " % (len(record) + digits + 1) + record
        if len(line) == len(record) + digits + 1:
            break
    return _pax_member(line, _pax_member(line))
