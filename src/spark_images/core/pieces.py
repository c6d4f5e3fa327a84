"""A file given as its pieces, in order, read by slices and searched without joining them (pure).

A layer reader hands out a big member as the chunks it was inflated in. The
cubin scan reads a few slices of a library (headers, the section table, the
fatbin containers' headers, the payloads it proves) and searches the rest for
the fatbin magic: joining the chunks into one buffer first copied every byte of
the 3.47 GiB of device-code libraries in the real cu130 image, where a slice
that lies inside one chunk needs no copy at all. `Pieces` answers a slice
inside one piece with a view of it, one across a seam with the bytes joined,
and `find` as `bytes.find` does, seams included.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from itertools import accumulate

from spark_images.core.buffers import MEMMEM, Exported, find_bounds


class Pieces:
    """`views` (memoryviews, in order) read as one file: `len`, slices (`Sliceable`), `find`.

    A piece `find` searches is held exported from then on, so that libc's memmem
    runs on it without the GIL; `close` (or the `with` block's end) lets go of
    them all, and until then an exported piece's memory cannot be freed."""

    def __init__(self, views: Sequence[memoryview]) -> None:
        self.views = [v for v in views if len(v)]
        self.starts = list(accumulate((len(v) for v in self.views), initial=0))  # one more: the end
        self._held: dict[int, Exported] = {}

    def __len__(self) -> int:
        return self.starts[-1]

    def __enter__(self) -> Pieces:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Let go of the pieces (their memory is freed once no slice of them is alive)."""
        for held in self._held.values():
            held.close()
        self._held = {}
        self.views = []
        self.starts = [0]

    def __bytes__(self) -> bytes:
        """The whole file joined (a copy: for a consumer that needs one buffer after all)."""
        return b"".join(self.views)

    def _piece(self, at: int) -> int:
        return bisect.bisect_right(self.starts, at) - 1

    def __getitem__(self, key: slice, /) -> memoryview | bytes:
        start, stop, step = key.indices(len(self))
        if step != 1:
            raise ValueError("Pieces: only contiguous slices")
        if stop <= start:
            return b""
        i = self._piece(start)
        at = self.starts[i]
        if stop <= self.starts[i + 1]:
            return self.views[i][start - at : stop - at]  # inside one piece: no copy
        out = []
        while start < stop:
            view, at = self.views[i], self.starts[i]
            take = view[start - at : min(stop - at, len(view))]
            out.append(take)
            start += len(take)
            i += 1
        return b"".join(out)

    def find(self, needle: bytes, start: int, stop: int) -> int:
        """The first `needle` in [start, stop), bounds as `bytes.find` takes them; -1 if none."""
        start, stop = find_bounds(len(self), start, stop)
        n = len(needle)
        if stop - start < n:
            return -1
        if not n:
            return start
        i = self._piece(start)
        while i < len(self.views) and self.starts[i] < stop:
            lo, hi = max(start, self.starts[i]), min(stop, self.starts[i + 1])
            hit = self._inside(i, needle, lo, hi)
            if hit >= 0:
                return hit
            seam = self.starts[i + 1]
            if seam < stop:  # a needle that begins in this piece and ends in a later one
                first = max(start, seam - n + 1)
                found = bytes(self[first : min(stop, seam + n - 1)]).find(needle)
                if found >= 0:
                    return first + found
            i += 1
        return -1

    def _inside(self, i: int, needle: bytes, lo: int, hi: int) -> int:
        """`needle` wholly inside piece i's part [lo, hi) of the file."""
        if hi - lo < len(needle):
            return -1
        at = self.starts[i]
        if MEMMEM is not None:
            held = self._held.get(i)
            if held is None:
                held = self._held[i] = Exported(self.views[i])  # type: ignore[arg-type]
            if held.address:
                hit = MEMMEM(held.address + lo - at, hi - lo, needle, len(needle))
                return -1 if hit is None else int(hit) - held.address + at
        found = bytes(self.views[i][lo - at : hi - at]).find(needle)
        return -1 if found < 0 else lo + found
