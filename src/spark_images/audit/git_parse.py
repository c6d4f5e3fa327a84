"""What git prints, turned into data (pure: no process, no I/O).

`git.py` runs git and hands its output here. Each `--format` string lives
next to the parser that splits it, so the two cannot drift apart.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from spark_images.audit.history import CommitInfo

SEP = "\x1f"
HEX = re.compile(r"^[0-9a-f]{4,40}$")
LOG_FORMAT_LEAN = "%H%x1f%T%x1f%P%x1f%ct%x1f%s"
LOG_FORMAT_FULL = "%H%x1f%T%x1f%P%x1f%ct%x1f%s%x1f%b"
TAG_FORMAT = "%(refname:strip=2)%1f%(objecttype)%1f%(objectname)%1f%(*objecttype)%1f%(*objectname)"
RANGE_FORMAT = "%x1e%H%x1f%s%x1f%b%x1d"


@dataclass(frozen=True)
class TagRef:
    name: str
    commit: str


class BatchCut(Exception):
    """`git cat-file --batch` stopped before answering for this path."""


def last_line(data: bytes) -> str:
    """The last non-blank line of git's stderr: the one that says why."""
    lines = [ln.strip() for ln in data.decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-1] if lines else "no message"


def parse_tags(out: bytes) -> list[TagRef]:
    """Tags that name a commit, directly or through an annotated tag (TAG_FORMAT)."""
    tags: list[TagRef] = []
    for line in out.decode("utf-8", "replace").splitlines():
        name, otype, oid, ptype, poid = (line.split(SEP) + [""] * 5)[:5]
        if otype == "commit":
            tags.append(TagRef(name, oid))
        elif otype == "tag" and ptype == "commit":
            tags.append(TagRef(name, poid))
    return tags


def parse_log(out: bytes) -> list[CommitInfo]:
    """`git log -z` records in LOG_FORMAT_LEAN or LOG_FORMAT_FULL."""
    commits: list[CommitInfo] = []
    for record in out.decode("utf-8", "replace").split("\x00"):
        if not record:
            continue
        parts = record.split(SEP, 5)
        if len(parts) < 5:
            continue
        sha, tree, parents, when = parts[0].strip(), parts[1], parts[2], parts[3]
        body = parts[5] if len(parts) > 5 else ""
        commits.append(
            CommitInfo(
                sha=sha,
                tree=tree,
                parents=tuple(parents.split()),
                subject=parts[4],
                body=body,
                time=int(when) if when.isdigit() else 0,
            )
        )
    return commits


def parse_messages(wanted: Sequence[str], data: bytes) -> dict[str, tuple[str, str]]:
    """(subject, body) per asked commit from `git cat-file --batch`; others left out."""
    found: dict[str, tuple[str, str]] = {}
    pos = 0
    for asked in wanted:
        nl = data.find(b"\n", pos)
        if nl < 0:
            break
        header = data[pos:nl].decode().split()
        pos = nl + 1
        if len(header) < 3 or header[1] != "commit":
            if len(header) == 3:
                pos += int(header[2]) + 1
            continue
        size = int(header[2])
        raw = data[pos : pos + size].decode("utf-8", "replace")
        pos += size + 1
        _, _, message = raw.partition("\n\n")
        subject, _, body = message.partition("\n")
        found[asked] = (subject.strip(), body)
    return found


def parse_blobs(paths: Sequence[str], data: bytes) -> dict[str, bytes | None]:
    """The blob per asked path from `git cat-file --batch` (None: not a file there).

    Raises BatchCut naming the first path git gave no answer for."""
    result: dict[str, bytes | None] = {}
    pos = 0
    for path in paths:
        nl = data.find(b"\n", pos)
        if nl < 0:
            raise BatchCut(path)
        header = data[pos:nl].decode().split()
        pos = nl + 1
        if len(header) == 3 and header[1] == "blob":
            size = int(header[2])
            result[path] = data[pos : pos + size]
            pos += size + 1
        else:
            if len(header) == 3:  # a tree or other object at that path
                pos += int(header[2]) + 1
            result[path] = None
    return result


def parse_rename(out: bytes, path: str) -> str | None:
    """Where `git diff-tree -M --name-status -z` says `path` was renamed to."""
    fields = out.decode("utf-8", "replace").split("\x00")
    i = 0
    while i < len(fields):
        status = fields[i]
        if status.startswith(("R", "C")) and i + 2 < len(fields):
            if fields[i + 1] == path and status.startswith("R"):
                return fields[i + 2]
            i += 3
        else:
            i += 2
    return None


def parse_range(out: bytes) -> list[tuple[str, str, str, list[str]]]:
    """(sha, subject, body, changed paths) per `git log --name-only` record in RANGE_FORMAT."""
    found: list[tuple[str, str, str, list[str]]] = []
    for record in out.decode("utf-8", "replace").split("\x1e"):
        head, _, names = record.partition("\x1d")
        parts = head.split(SEP, 2)
        if len(parts) < 3:
            continue
        found.append((parts[0].strip(), parts[1], parts[2], [n for n in names.splitlines() if n.strip()]))
    return found


def added_lines(out: bytes) -> dict[str, list[tuple[str, str]]]:
    """sha -> [(path, added line)] from `-U0` diffs whose records start with `%x1e%H`."""
    found: dict[str, list[tuple[str, str]]] = {}
    for record in out.decode("utf-8", "replace").split("\x1e"):
        lines = record.split("\n")
        sha = lines[0].strip()
        if not HEX.match(sha):
            continue
        path = ""
        added: list[tuple[str, str]] = []
        for line in lines[1:]:
            if line.startswith("+++ "):
                path = line[6:] if line.startswith("+++ b/") else ""
            elif line.startswith("+") and path:
                added.append((path, line[1:]))
        found[sha] = added
    return found


def parse_patch_ids(out: bytes) -> dict[str, str]:
    """`git patch-id` output (`PATCH_ID COMMIT` per line) as commit -> patch-id."""
    found: dict[str, str] = {}
    for line in out.decode("ascii", "replace").splitlines():
        parts = line.split()
        if len(parts) == 2 and HEX.match(parts[0]) and HEX.match(parts[1]):
            found[parts[1]] = parts[0]
    return found
