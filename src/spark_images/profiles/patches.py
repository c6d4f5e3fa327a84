"""Patch headers: which upstream PRs a patch in patches/ backports (pure).

A patch starts with header lines before the diff, e.g.

    Backport-Of: vllm-project/vllm#40923
    Upstream-Commit: 6cc8577421f2...

One `Backport-Of` line per PR. A header alone proves nothing: the audit reports
such a PR as `patched` only when the build applies the patch (the source
strategy), the patch has hunks, `git apply --check` passes at the pinned commit
and the fix's markers hold in the patched tree.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from spark_images.core.inputs import MiB

PATCH_LIMIT = 4 * MiB  # a backport is a few KB

_BACKPORT = re.compile(r"^Backport-Of:\s*(?:vllm-project/vllm)?#(\d+)\s*$", re.MULTILINE)
_DIFF_START = re.compile(r"^(diff --git |--- )", re.MULTILINE)
_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@", re.MULTILINE)


def header(text: str) -> str:
    """The part of a patch before its first diff."""
    m = _DIFF_START.search(text)
    return text[: m.start()] if m else text


def declared_prs(text: str) -> list[int]:
    """PR numbers the patch header declares, in order, without repeats."""
    seen: list[int] = []
    for m in _BACKPORT.finditer(header(text)):
        pr = int(m.group(1))
        if pr not in seen:
            seen.append(pr)
    return seen


def hunk_count(text: str) -> int:
    """The `@@ -a,b +c,d @@` hunks of the diff: a patch without any changes nothing."""
    m = _DIFF_START.search(text)
    return len(_HUNK.findall(text, m.start())) if m else 0


@dataclass(frozen=True)
class PatchRef:
    """A patch as the build and the audit both see it: path, digest of its bytes, declared PRs."""

    path: str
    sha256: str
    prs: tuple[int, ...]


def patch_ref(path: str, text: str) -> PatchRef:
    """The one place a PatchRef is made."""
    return PatchRef(path=path, sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(), prs=tuple(declared_prs(text)))
