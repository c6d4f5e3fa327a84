"""Directories, single files, wheels and NAME==VERSION requirements as members.

Zip members are inflated as a stream: small ones into memory, large ones
into a mapped temporary file (`spool_over`), so a wheel scan holds at most
one chunk of a large library in memory. A member whose declared size or
compression ratio is over the caps is refused before any byte is inflated.
"""

from __future__ import annotations

import io
import mmap
import os
import posixpath
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from spark_images import pypi
from spark_images.core.errors import UsageError
from spark_images.readers.common import (
    MAX_MEMBER,
    Member,
    Progress,
    ShortRead,
    Want,
    close_quietly,
    exceeds_ratio,
    exceeds_size,
    over_ratio,
    read_exact,
    run_ahead,
    yield_and_close,
)

# range-read a wheel when the wanted members are at most this share of it
RANGE_SHARE = 0.3


def _read_file(path: Path, rel: str, spool_over: int | None = None) -> Member:
    try:
        size = path.stat().st_size
        if spool_over is not None and size > spool_over and size > 0:
            with path.open("rb") as fh:
                return Member(rel, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ))
        if size > MAX_MEMBER:
            return Member(rel, None, exceeds_size(size))
        with path.open("rb") as fh:
            return Member(rel, read_exact(fh, size, rel, None))
    except (OSError, ValueError) as exc:
        return Member(rel, None, f"cannot read ({getattr(exc, 'strerror', None) or exc})")


def _read_entry(path: str, rel: str, spool_over: int | None) -> Member:
    """One file of a directory walk: one open and one fstat (the walk's d_type said it is a file)."""
    try:
        with open(path, "rb", buffering=0) as fh:
            size = os.fstat(fh.fileno()).st_size
            if spool_over is not None and size > spool_over and size > 0:
                return Member(rel, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ))
            if size > MAX_MEMBER:
                return Member(rel, None, exceeds_size(size))
            return Member(rel, read_exact(fh, size, rel, None))
    except (OSError, ValueError) as exc:
        return Member(rel, None, f"cannot read ({getattr(exc, 'strerror', None) or exc})")


def dir_members(root: Path, want: Want, spool_over: int | None = None) -> Iterator[Member]:
    """Regular files below `root` (symlinks not followed), each directory's files in name
    order before its subdirectories. `os.scandir` gives each entry's type without a stat."""
    stack = [(os.fspath(root), "")]
    while stack:
        top, prefix = stack.pop()
        try:
            with os.scandir(top) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue  # as os.walk: an unreadable directory is passed over
        subdirs = []
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                subdirs.append((entry.path, prefix + entry.name + "/"))
            elif entry.is_file(follow_symlinks=False) and want(rel := prefix + entry.name):
                yield from yield_and_close(_read_entry(entry.path, rel, spool_over))
        stack.extend(reversed(subdirs))


def file_member(path: Path, want: Want, spool_over: int | None = None) -> Iterator[Member]:
    if want(path.name):
        yield from yield_and_close(_read_file(path, path.name, spool_over))


def _zip_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, label: str, spool_over: int | None) -> Member:
    if info.file_size > MAX_MEMBER:
        return Member(info.filename, None, exceeds_size(info.file_size))
    if over_ratio(info.file_size, info.compress_size):
        return Member(info.filename, None, exceeds_ratio(info.file_size, info.compress_size))
    try:
        with archive.open(info) as fh:
            return Member(info.filename, read_exact(fh, info.file_size, info.filename, spool_over))
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError, ValueError) as exc:
        return Member(info.filename, None, f"unreadable zip member in {label} ({exc})")


def install_path(name: str) -> str | None:
    """Where pip puts zip member `name`, relative to site-packages, or None outside it.

    pip joins the member's `os.path.normpath` to the target and refuses the
    wheel when that leaves it (`..`, an absolute path).
    """
    normed = posixpath.normpath(name)
    if normed.startswith("/") or normed == ".." or normed.startswith("../") or normed == ".":
        return None
    return normed


def zip_members(
    archive: zipfile.ZipFile, want: Want, label: str, spool_over: int | None = None
) -> Iterator[Member]:
    """Wanted members in archive order, named by where pip installs them.

    The next one is inflated while this one is used. Two members that install
    at one path (the same name twice, or one reached through `..`): pip writes
    them in archive order, so the last is the file installed; only it is read,
    under that path, and each earlier one is a member with the error that says
    so, never dropped silently. A member outside site-packages is a UsageError:
    pip refuses to install such a wheel.
    """
    infos = [i for i in archive.infolist() if not i.is_dir()]
    paths: list[tuple[zipfile.ZipInfo, str]] = []
    for info in infos:
        path = install_path(info.filename)
        if path is None:
            raise UsageError(
                f"{label}: member {info.filename!r} installs outside site-packages, so pip refuses the wheel "
                "(fix: rebuild it without '..' or absolute member names)"
            )
        paths.append((info, path))
    last = {path: info for info, path in paths}  # a later member overwrites an earlier one, as pip's writes do
    wanted: list[Member | tuple[zipfile.ZipInfo, str]] = []
    for info, path in paths:
        if not want(path):
            continue
        kept = last[path]
        if kept is info:
            wanted.append((info, path))
        else:
            why = f"not installed: the later member {kept.filename!r} installs at {path} too, and pip keeps the last"
            wanted.append(Member(info.filename, None, why))
    made = (item if isinstance(item, Member) else _named(_zip_member(archive, item[0], label, spool_over), item[1])
            for item in wanted)  # fmt: skip
    for member in run_ahead(made, depth=1, drop=lambda m: close_quietly(m.data)):
        yield from yield_and_close(member)


def _named(member: Member, path: str) -> Member:
    return member if member.path == path else Member(path, member.data, member.error)


def open_zip(source: Path | BinaryIO, label: str) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(source)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise UsageError(f"{label}: not a readable zip/wheel ({exc})") from exc


def wheel_members(path: Path, want: Want, spool_over: int | None = None) -> Iterator[Member]:
    with open_zip(path, str(path)) as archive:
        yield from zip_members(archive, want, str(path), spool_over)


def requirement_members(
    target: str, want: Want, progress: Progress, spool_over: int | None = None
) -> Iterator[Member]:
    wheel = pypi.resolve(target)
    local = pypi.cached(wheel)
    if local is None:
        remote = pypi.HttpRangeFile(wheel.url, wheel.size)
        try:
            archive = open_zip(io.BufferedReader(remote, buffer_size=1 << 16), wheel.url)
        except UsageError:
            archive = None
        if archive is not None:
            wanted = sum(i.compress_size for i in archive.infolist()
                         if not i.is_dir() and want(install_path(i.filename) or i.filename))  # fmt: skip
            if wanted <= RANGE_SHARE * wheel.size:
                with archive:
                    yield from zip_members(archive, want, wheel.filename, spool_over)
                return
            archive.close()
        progress.start(f"downloading {wheel.filename}", wheel.size)
        last = 0

        def report(done: int, _total: int) -> None:
            nonlocal last
            progress.advance(done - last)
            last = done

        local = pypi.download(wheel, report)
        progress.finish()
    yield from wheel_members(local, want, spool_over)


__all__ = ["ShortRead", "dir_members", "file_member", "install_path", "open_zip", "requirement_members", "wheel_members", "zip_members"]
