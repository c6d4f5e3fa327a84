"""One layer reader: a tar header walk over a gzip/zstd/plain layer stream, plus whiteouts.

The walk (`_walk`) reads the 512-byte headers itself (ustar, GNU long names,
pax) and skips the data of unwanted members by seeking, which drops whole
decompressed chunks: no per-member tarfile object, nothing copied.
`layer_entries` (for `repro`, which compares modes and owners) still uses
stdlib `tarfile` with `_TarInfo`.

Layers are read from the top one down, so a path is yielded once (its
topmost version) and files that a later layer deleted (`.wh.NAME`) or hid
(`.wh..wh..opq`) never appear. A hard link is resolved within its layer when
the file it points to was wanted and kept (small budget), else reported.

Every layer is bounded: decompression stops with `exceeds` past a ratio or
an absolute size, extended tar headers have a size cap, and a corrupt header
anywhere in the stream is an error, never a silent end of the layer.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import mmap
import operator
import struct
import tarfile
import zlib
from collections.abc import Iterator
from typing import NamedTuple

from spark_images.core.errors import UsageError
from spark_images.core.pieces import Pieces
from spark_images.readers.common import (
    MAX_MEMBER,
    MEMORY_SPOOL,
    READ_CHUNK,
    Data,
    Member,
    Readable,
    ShortRead,
    Sieve,
    SieveRun,
    SpoolArena,
    Want,
    close_quietly,
    exceeds_size,
    read_exact,
    release_pages,
    run_ahead,
    spool_views,
)
from spark_images.readers.streams import INFLATE_ERRORS, ForwardStream, LayerError, Opener, inflated

# pax / GNU long-name headers are a few hundred bytes in real layers
MAX_EXTENDED = 1 << 20
# what a layer may keep of its wanted files so that later hard links to them can be answered: a
# link follows its target in the tar stream, and image builders write the link where the walk of the
# file system meets it (the same or a nearby directory), so the newest members are kept. Keeping every
# spooled library of a layer held 388 MiB of them at once in the 2.3 GB check of benchmarks/check.py
KEEP_BYTES = 32 << 20
KEEP_MAPPED = 128 << 20
# where a walk spools at all, members above this go to its arena whatever the caller's threshold:
# a member crossing chunks was joined into a fresh bytes object, its pages faulted and zeroed with
# the GIL held, where the arena's pwrite reuses pages without it (the 1.5 GB of 1-64 MiB members
# of the cu130 image: 190k fewer page faults per scan)
ARENA_OVER = 1 << 20
# what a walk holds of one sifted member's chunks (uncopied) while its sieve has not asked for the
# bytes; past this it is kept whole (as its pieces where the sieve `takes_pieces`, else spooled).
# The largest library without device code in the cu130 image is libtriton (451 MiB); one with
# device code shows its first fatbin within 139 MiB (libcublasLt).
# Only a walk of a file on disk sifts (`read_layers`)
HOLD_MAX = 512 << 20


_EXTENDED = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)


# a ustar / GNU header up to its prefix field: name mode uid gid size mtime chksum type
# linkname magic+version uname gname devmajor devminor prefix
_HEADER = struct.Struct("100s8s8s8s12s12s8sc100s8s32s32s8s8s155s")
_NUMBERS = operator.itemgetter(1, 2, 3, 4, 5, 6, 12, 13)  # mode uid gid size mtime chksum devmajor devminor
_TEXTS = operator.itemgetter(0, 8, 10, 11, 14)  # name linkname uname gname prefix


def _byte_sum(block: bytes) -> int:
    """sum(block) of a 512-byte header, exactly, from two adler32 calls (C, vectorised).

    adler32's low half is 1 + the byte sum mod 65521, and 256 bytes sum to at most
    65280, so each half's is exact. `sum` iterates the bytes as Python ints: 1.8 us a
    header against 0.34 us, on every one of an image's tens of thousands of headers."""
    return (zlib.adler32(block[:256]) & 0xFFFF) + (zlib.adler32(block[256:512]) & 0xFFFF) - 2


class _TarInfo(tarfile.TarInfo):
    """tarfile's own header parser with two guards a hostile layer needs, and a fast path.

    In stream mode tarfile ends the archive silently at a corrupt header after
    the first one; that would drop the rest of a layer without a word, so such
    a header raises here. Extended headers are read whole into memory by
    tarfile, so their size is capped first.

    `frombuf` reads the common header (octal numbers, the unsigned checksum,
    no GNU sparse map) with one struct unpack instead of tarfile's thirteen
    field calls: an image has tens of thousands of headers, and they were a
    third of a scan's parsing thread. Anything else (base-256 numbers, a
    signed or bad checksum, an end block, sparse files) goes to tarfile's own
    `frombuf`, which decides and raises; a test holds the two equal on real
    and odd headers.
    """

    @classmethod
    def frombuf(cls, buf: bytes, encoding: str, errors: str) -> tarfile.TarInfo:
        if len(buf) != tarfile.BLOCKSIZE or buf[156:157] == tarfile.GNUTYPE_SPARSE:
            return super().frombuf(buf, encoding, errors)  # type: ignore[misc]
        fields = _HEADER.unpack_from(buf)
        try:
            # octal as tarfile's `nti` reads it; a base-256 field (0x80 / 0xff first) fails here too
            numbers = [int(f.split(b"\0", 1)[0].strip() or b"0", 8) for f in _NUMBERS(fields)]
        except ValueError:
            return super().frombuf(buf, encoding, errors)  # type: ignore[misc]
        if numbers[5] != 256 + _byte_sum(buf) - sum(buf[148:156]):  # only the unsigned checksum here
            return super().frombuf(buf, encoding, errors)  # type: ignore[misc]
        obj = cls()
        obj.mode, obj.uid, obj.gid, obj.size, obj.mtime, obj.chksum, obj.devmajor, obj.devminor = numbers  # type: ignore[assignment]
        obj.name, obj.linkname, obj.uname, obj.gname, prefix = [
            f.split(b"\0", 1)[0].decode(encoding, errors) for f in _TEXTS(fields)
        ]
        obj.type = fields[7]
        if obj.type == tarfile.AREGTYPE and obj.name.endswith("/"):  # a V7 directory
            obj.type = tarfile.DIRTYPE
        if obj.isdir():
            obj.name = obj.name.rstrip("/")
        if prefix and obj.type not in tarfile.GNU_TYPES:  # a ustar long name
            obj.name = prefix + "/" + obj.name
        return obj

    @classmethod
    def fromtarfile(cls, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        try:
            return super().fromtarfile(tarfile_)
        except (tarfile.InvalidHeaderError, tarfile.TruncatedHeaderError) as exc:
            raise tarfile.SubsequentHeaderError(f"{exc} at byte {tarfile_.offset}") from None

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _EXTENDED and self.size > MAX_EXTENDED:
            raise tarfile.SubsequentHeaderError(f"extended header {self.name!r:.80} of {self.size} bytes exceeds {MAX_EXTENDED}")
        return super()._proc_member(tarfile_)  # type: ignore[misc]


def _norm(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name.strip("/")


class Overlay:
    """Whiteout bookkeeping while layers are read from the top down."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.hidden_trees: set[str] = set()

    def visible(self, path: str) -> bool:
        if path in self.seen:
            return False
        hidden = self.hidden_trees
        while path:  # the path itself, then each parent directory
            if path in hidden:
                return False
            path = path.rpartition("/")[0]
        return True


class _Kept:
    """Wanted files of one layer, the newest within a budget, for hard links that name them later.

    A member that does not fit alone is not kept; one that does pushes the oldest kept
    members of its kind out (this object closes them), so memory stays at the budget
    however many libraries a layer holds. A link to a file pushed out is reported."""

    def __init__(self) -> None:
        self.data: dict[str, Data] = {}  # in the order kept
        self.bytes = 0
        self.mapped = 0
        self.summaries: dict[str, object] = {}  # sifted members: a few small records, kept all

    def offer(self, name: str, data: Data) -> bool:
        """Keep `data` if the budget allows; True when kept (then this object closes it)."""
        size = len(data)
        small = isinstance(data, bytes)
        budget = KEEP_BYTES if small else KEEP_MAPPED
        if size > budget:
            return False
        self._drop(name)  # a path met twice in one layer: the later one is the file
        while (self.bytes if small else self.mapped) + size > budget:
            self._drop(next(k for k, d in self.data.items() if isinstance(d, bytes) == small))
        self.data[name] = data
        if small:
            self.bytes += size
        else:
            self.mapped += size
        return True

    def _drop(self, name: str) -> None:
        data = self.data.pop(name, None)
        if data is None:
            return
        if isinstance(data, bytes):
            self.bytes -= len(data)
        else:
            self.mapped -= len(data)
        close_quietly(data)

    def close(self) -> None:
        for data in self.data.values():
            close_quietly(data)
        self.data.clear()
        self.summaries.clear()
        self.bytes = self.mapped = 0


# --- the layer walk: tar headers read straight off the stream --------------------------------

_BLOCK = tarfile.BLOCKSIZE
_ZEROS = bytes(_BLOCK)
_ENC, _ERR = "utf-8", "surrogateescape"  # what tarfile.open uses on Linux
# types whose size field frames data that follows the header (tarfile: regular, or unknown)
_NO_DATA = frozenset(tarfile.SUPPORTED_TYPES) - frozenset(tarfile.REGULAR_TYPES)
_SPARSE_KEYS = ("GNU.sparse.map", "GNU.sparse.size", "GNU.sparse.major", "GNU.sparse.offset")


class _Entry(NamedTuple):
    """One member as the walk meets it: only what the overlay and the reader need."""

    name: str
    type: bytes
    size: int
    linkname: str
    sparse: bool  # GNU or pax sparse: real layers have none; reported, never read


def _nts(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode(_ENC, _ERR)


def _header(block: bytes) -> tuple[str, bytes, int, str]:
    """(name, type, size, linkname) of one 512-byte header; tarfile.HeaderError when it is not one.

    The common header (octal size and checksum, the unsigned checksum) is read here
    in a few slices; anything else goes to `_TarInfo.frombuf` (tarfile's rules)."""
    kind = block[156:157]
    try:
        size = int(block[124:136].split(b"\0", 1)[0].strip() or b"0", 8)
        chksum = int(block[148:156].split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        chksum = -1
    if chksum != 256 + _byte_sum(block) - sum(block[148:156]) or kind == tarfile.GNUTYPE_SPARSE or len(block) != _BLOCK:
        info = _TarInfo.frombuf(block, _ENC, _ERR)
        return info.name, info.type, info.size, info.linkname
    name = _nts(block[:100])
    if kind == tarfile.AREGTYPE and name.endswith("/"):  # a V7 directory
        kind = tarfile.DIRTYPE
    if kind == tarfile.DIRTYPE:
        name = name.rstrip("/")
    if block[345] and kind not in tarfile.GNU_TYPES:  # a ustar long name
        prefix = _nts(block[345:500])
        if prefix:
            name = prefix + "/" + name
    return name, kind, size, _nts(block[157:257])


def _pax_records(data: bytes, where: int) -> dict[str, str]:
    """`LEN key=value\\n` records of a pax header (values UTF-8, as tarfile reads them)."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos] != 0:
        space = data.find(b" ", pos, pos + 24)
        try:
            length = int(data[pos:space]) if space > pos else 0
        except ValueError:
            length = 0
        end = pos + length
        if length <= 0 or end > len(data) or data[end - 1 : end] != b"\n" or b"=" not in data[space + 1 : end]:
            raise tarfile.SubsequentHeaderError(f"invalid pax header record at byte {where + pos}")
        key, _, value = data[space + 1 : end - 1].partition(b"=")
        out[key.decode(_ENC, _ERR)] = value.decode(_ENC, _ERR)
        pos = end
    return out


def _walk(stream: ForwardStream) -> Iterator[_Entry]:
    """Every member of a tar stream; after each one is yielded the stream stands at its data.

    The consumer may read the data (at most `size` bytes) or not: the walk then skips
    to the next header by seeking, so skipped data is dropped chunk by chunk, never
    copied. pax ('x', 'g') and GNU long names ('L', 'K') are applied as tarfile applies
    them; extended headers over MAX_EXTENDED are refused; a header that is not one, or a
    stream that ends inside a header or inside a member's data, is a LayerError, except
    at the very start (an empty layer, which yields nothing). End blocks end the walk.
    """
    pax_global: dict[str, str] = {}
    global_bytes = 0  # all 'g' headers of the layer together stay under MAX_EXTENDED too
    while True:
        at = stream.tell()
        block = stream.read(_BLOCK)
        if not block:
            return  # no end blocks: tarfile also takes the end of the data as the end
        if block == _ZEROS:
            return
        extended: dict[str, str] = {}
        long_name = long_link = None
        ext_bytes = 0  # the extended headers of one member together, a chain of them included
        try:
            name, kind, size, link = _header(block)
            while kind in _EXTENDED:  # an extended header, then the header it extends
                ext_bytes += size
                global_bytes += size if kind == tarfile.XGLTYPE else 0
                if max(ext_bytes, global_bytes) > MAX_EXTENDED:
                    raise LayerError(f"extended header {name!r:.80} of {size} bytes exceeds {MAX_EXTENDED} (with those before it)")
                data = stream.read(size)
                if len(data) < size:
                    raise LayerError(f"tar stream ends inside an extended header at byte {at}")
                stream.seek(stream.tell() + (-size % _BLOCK))
                if kind == tarfile.GNUTYPE_LONGNAME:
                    long_name = _nts(data)
                elif kind == tarfile.GNUTYPE_LONGLINK:
                    long_link = _nts(data)
                elif kind == tarfile.XGLTYPE:
                    pax_global.update(_pax_records(data, at))
                else:
                    extended.update(_pax_records(data, at))
                block = stream.read(_BLOCK)
                if len(block) < _BLOCK or block == _ZEROS:
                    raise LayerError(f"tar stream ends after an extended header at byte {at}")
                name, kind, size, link = _header(block)
        except tarfile.HeaderError as exc:
            raise LayerError(f"{exc} at byte {at}") from None
        pax = {**pax_global, **extended} if pax_global else extended
        sparse = kind == tarfile.GNUTYPE_SPARSE
        more = sparse and block[482]  # an old GNU sparse map goes on in blocks of its own
        while more:
            ext = stream.read(_BLOCK)
            if len(ext) < _BLOCK:
                raise LayerError(f"tar stream ends inside the sparse map of {name!r:.120}")
            more = ext[504]
        if pax:
            name = pax.get("path", name)
            link = pax.get("linkpath", link)
            sparse = sparse or any(k in pax for k in _SPARSE_KEYS)
            if "size" in pax:
                try:
                    size = int(pax["size"])
                except ValueError:
                    raise LayerError(f"pax size {pax['size']!r:.40} of {name!r:.80} is not a number") from None
        if size < 0:
            raise LayerError(f"{name!r:.120} declares a negative size {size}")
        if long_name is not None:
            name = long_name
        if long_link is not None:
            link = long_link
        start = stream.tell()
        yield _Entry(name, kind, size, link, sparse)
        if kind in _NO_DATA:
            continue
        if stream.seek(start + size) != start + size:
            raise LayerError(f"tar stream ends inside {name!r:.120} ({size} bytes declared)")
        stream.seek(start + size + (-size % _BLOCK))


def layer_members(
    stream: ForwardStream, overlay: Overlay, want: Want, label: str, spool_over: int | None = None,
    arena: SpoolArena | None = None, sieve: Sieve | None = None,
) -> Iterator[Member]:  # fmt: skip
    """The visible wanted members of one layer; updates `overlay` when the layer ends.

    Every entry goes into this layer's seen and hidden sets, visible or not: a path
    an upper layer already hides stays hidden below it either way, so visibility is
    worked out for wanted entries only. `sieve`: see `readers.common.Sieve` (members
    that would be spooled are shown to it first)."""
    new_seen: set[str] = set()
    new_hidden: set[str] = set()
    kept = _Kept()
    try:
        for entry in _walk(stream):
            name = _norm(entry.name)
            parent, _, base = name.rpartition("/")
            if base.startswith(".wh."):
                if base == ".wh..wh..opq":
                    if parent:
                        new_hidden.add(parent)
                else:
                    new_hidden.add(f"{parent}/{base[4:]}" if parent else base[4:])
                continue
            kind = entry.type
            if not name or kind == tarfile.DIRTYPE:  # directories merge with lower layers
                continue
            new_seen.add(name)
            new_hidden.add(name)  # a non-directory replaces a lower directory of that name
            if not want(name) or not overlay.visible(name):
                continue
            if kind in tarfile.REGULAR_TYPES:
                member = _regular(stream, entry, name, spool_over, arena, sieve)
                if member.summary is not None:
                    kept.summaries[name] = member.summary
                keep = member.data is not None and kept.offer(name, member.data)
                try:
                    yield member
                finally:
                    if not keep:
                        close_quietly(member.data)
                    elif isinstance(member.data, mmap.mmap):
                        release_pages(member.data)  # kept for a hard link: keep it off the RSS meanwhile
            elif kind == tarfile.LNKTYPE:
                target = _norm(entry.linkname)
                data = kept.data.get(target)
                summary = kept.summaries.get(target)
                if data is not None:
                    yield Member(name, data)
                elif summary is not None and sieve is not None and sieve.sifts(name):
                    yield Member(name, None, summary=summary)  # the same bytes: the same answer
                else:
                    yield Member(name, None, f"hard link to {target} in {label}: that file was not kept (not wanted, or over the keep budget)")
    except tarfile.TarError as exc:
        raise LayerError(str(exc)) from exc
    finally:
        kept.close()
    overlay.seen |= new_seen
    overlay.hidden_trees |= new_hidden


def _data(tar: tarfile.TarFile, stream: ForwardStream, info: tarfile.TarInfo) -> Readable | None:
    """Where a regular member's bytes are read from (for `layer_entries`): the layer stream
    itself, at its data (the reader then stops at its size), or tarfile's view of a sparse file."""
    if info.issparse():
        return tar.extractfile(info)  # tarfile maps the holes; real layers have no sparse files
    stream.seek(info.offset_data)
    return stream


def _regular(
    stream: ForwardStream, entry: _Entry, name: str, spool_over: int | None, arena: SpoolArena | None,
    sieve: Sieve | None = None,
) -> Member:  # fmt: skip
    """A regular member's bytes, read from the layer stream where the walk left it (at its data);
    spooled above `spool_over`, or above ARENA_OVER where the walk has an arena; shown to `sieve`
    first where it would be spooled."""
    if entry.sparse:
        return Member(name, None, "a sparse file in the layer: not read (image builders write none)")
    if entry.size > MAX_MEMBER:
        return Member(name, None, exceeds_size(entry.size))
    if spool_over is not None and arena is not None:
        spool_over = min(spool_over, ARENA_OVER)
    try:
        if sieve is not None and spool_over is not None and entry.size > spool_over and sieve.sifts(name):
            return _sifted(stream, entry.size, name, sieve.start(), arena)
        return Member(name, read_exact(stream, entry.size, name, spool_over, framed=True, arena=arena))
    except ShortRead as exc:
        raise LayerError(f"tar stream ends inside {name} ({exc})") from exc


def _sifted(stream: ForwardStream, size: int, name: str, run: SieveRun, arena: SpoolArena | None) -> Member:
    """A member shown to a sieve chunk by chunk, held uncopied: its summary where the sieve never
    asked for the bytes, else its pieces where the sieve's consumer reads those (`takes_pieces`),
    else the member spooled as `_regular` does (from what was held, then on)."""
    pieces = stream.views(size)
    held: list[memoryview] = []
    got = 0
    for view in pieces:
        held.append(view)
        got += len(view)
        if run.needs_bytes(view) or got > HOLD_MAX:
            break
    else:
        summary = run.summary(held, size) if got == size else None
        if summary is not None:
            return Member(name, None, summary=summary)
    # the same generator goes on where the loop left it: the view it last gave is in `held`
    if size <= MEMORY_SPOOL and run.takes_pieces():
        # kept as inflated, nothing copied: the consumer reads it by slices. In memory as a spooled
        # member of this size would be; a larger one still goes to a file on disk
        held.extend(pieces)
        got = sum(map(len, held))
        if got < size:
            raise ShortRead(f"{name}: data ends {size - got} bytes before its declared size {size}")
        return Member(name, Pieces(held))
    return Member(name, spool_views(itertools.chain(held, pieces), size, name, arena))


# decompressed bytes that inflation may run ahead of the walk, across layers: the walk's work and
# the inflater's differ from layer to layer (a layer of 40k small files is all tar headers, a
# layer of model weights all inflation), and with a few chunks of slack one waited for the other.
# A download is bound by the network, and the registry check keeps its peak RSS under 512 MiB:
# 64 MiB (64 MiB to 1 GiB all timed the same on the 2 GB archive of benchmarks/at_limit.py).
AHEAD_BYTES = 64 << 20
# an archive on disk: the walk stalls for a second or more on each big library (the proofs of
# libcublasLt's and libtorch_cuda's cubins) while the inflater, which never waits on the disk,
# could run on. With 512 MiB of slack the inflater keeps its core through those stalls: the real
# cu130 archive's check.gather 12.2-12.5 s -> 10.3-10.7 s on 2 cores (benchmarks/RESULTS.md),
# for ~0.5 GiB more peak RSS
AHEAD_LOCAL_BYTES = 512 << 20
_LAYER_END = b""  # what the inflating thread puts between two layers (a chunk is never empty)


def read_layers(
    layers: list[tuple[str, Opener]], want: Want, where: str, spool_over: int | None = None, *, local: bool = False,
    sieve: Sieve | None = None,
) -> Iterator[Member]:  # fmt: skip
    """Merge layers (given bottom first) into the visible files, reading top first.

    One thread inflates the layers one after another, up to AHEAD_BYTES
    (AHEAD_LOCAL_BYTES from a file on disk) ahead of the walk, so the next
    layer is already inflating while this one's last members are parsed. `local`: the openers read a file on disk, in that thread
    (`streams.inflated`)."""
    overlay = Overlay()
    top_first = list(reversed(layers))
    # ISA-L, zstd, sha256 and file reads release the GIL: decompression runs in a thread ahead of
    # the tar parsing, spooling and scanning done here, so the two overlap
    ahead = AHEAD_LOCAL_BYTES if local else AHEAD_BYTES
    # a download is not sifted: held chunks are memory the copy into the arena frees at once, and
    # the registry check's peak RSS goal is 512 MiB (its check of a 2.29 GB image: 405-430 MiB
    # spooled, 488-493 MiB sifted even holding at most 16 MiB a member), while a loopback
    # download is already faster than the baseline's (0.94)
    sieve = sieve if local else None
    chunks = run_ahead(_inflated_layers(top_first, local), weigh=len, budget=ahead)
    arena = SpoolArena()  # the spooled members of every layer reuse its pages
    try:
        for digest, _open in top_first:
            stream = ForwardStream(_one_layer(chunks))
            with _unreadable_as_usage(where, digest):
                yield from layer_members(stream, overlay, want, f"layer {digest}", spool_over, arena, sieve)
                stream.drain()
    finally:
        chunks.close()
        arena.close()


def _inflated_layers(layers: list[tuple[str, Opener]], local: bool) -> Iterator[bytes]:
    for _digest, open_chunks in layers:
        yield from inflated(open_chunks, ahead=not local)
        yield _LAYER_END


def _one_layer(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """The chunks of the next layer, up to the end marker (an error inflating it is raised here)."""
    for chunk in chunks:
        if not chunk:  # _LAYER_END
            return
        yield chunk


@contextlib.contextmanager
def _unreadable_as_usage(where: str, digest: str) -> Iterator[None]:
    """A broken layer (tar, gzip, zstd or a cap) is one line naming the target and the layer."""
    try:
        yield
    except (LayerError, tarfile.TarError, *INFLATE_ERRORS, ValueError, EOFError) as exc:
        raise UsageError(f"{where}: layer {digest} is unreadable ({exc})") from exc
    except Exception as exc:
        if exc.__class__.__name__ == "ZstdError":
            raise UsageError(f"{where}: layer {digest} is unreadable ({exc})") from exc
        raise


def _open_tar(stream: ForwardStream) -> tarfile.TarFile | None:
    """tarfile over the stream ("r:": it seeks, and the stream only ever goes forward); None if empty."""
    try:
        return tarfile.open(fileobj=stream, mode="r:", tarinfo=_TarInfo)
    except tarfile.ReadError as exc:
        if str(exc) == "empty file":
            return None
        raise LayerError(str(exc)) from exc


def layer_entries(digest: str, open_chunks: Opener, where: str) -> Iterator[tuple[tarfile.TarInfo, str]]:
    """Every entry of one layer as stored (no overlay, no whiteouts applied), with the
    sha256 of each regular file's bytes ("" for other entries).

    For comparing two builds layer by layer (`repro`): mode, owner and mtime are
    where irreproducible builds differ, so nothing is merged or hidden here.
    """
    stream = ForwardStream(run_ahead(inflated(open_chunks), depth=4))
    with _unreadable_as_usage(where, digest):
        tar = _open_tar(stream)
        while tar is not None and (info := tar.next()) is not None:
            tar.members.clear()
            yield info, _content_sha256(tar, stream, info) if info.isreg() else ""
        stream.drain()


def _content_sha256(tar: tarfile.TarFile, stream: ForwardStream, info: tarfile.TarInfo) -> str:
    digest = hashlib.sha256()
    source = _data(tar, stream, info)
    left = info.size
    while left > 0 and source is not None:
        chunk = source.read(min(READ_CHUNK, left))
        if not chunk:
            raise LayerError(f"tar stream ends inside {info.name}")
        digest.update(chunk)
        left -= len(chunk)
    return digest.hexdigest()
