"""Which release first shipped a fix, and whether that answer is proven (pure).

The releases are PyPI's (the authoritative list; a clone's tags are only a
cache of their commits) plus vLLM's rc tags. A release is *checked* when its
commit is in the history and was looked at; an *unchecked* one (its tag is
missing and its PyPI commit is not in this clone, or PyPI could not be asked)
could hold the fix too. So the first release is exact only when every earlier
release was checked; otherwise it is only an upper bound.

`first_rc` is the first tagged build of any kind, rc or final, that carried
the fix: a final cut on a release branch can ship a cherry-pick before any rc
on main does, so it is never later than `first_release`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from spark_images.audit.releases import ReleaseName, parse_tag


@dataclass(frozen=True)
class Release:
    """One release: `tag` is how it is shown (`v0.22.0`), `commit` None when unchecked."""

    name: ReleaseName
    tag: str
    commit: str | None
    why_unchecked: str = ""
    uploaded: int | None = None  # when PyPI got its first file (None: unknown, e.g. an rc tag)

    @property
    def final(self) -> bool:
        return self.name.kind == "final"


@dataclass(frozen=True)
class FirstShipped:
    first_release: str | None = None
    first_release_at_most: str | None = None
    first_rc: str | None = None
    first_rc_at_most: str | None = None
    unchecked: tuple[str, ...] = ()
    # unchecked releases left out because PyPI got them before the fix's commit existed
    excluded_before_merge: int = 0


def release_list(
    versions: Iterable[str] | None,
    tags: dict[str, str],
) -> list[tuple[ReleaseName, str, str | None]]:
    """(name, shown tag, commit from a tag or None) for every release, oldest first.

    `versions`: PyPI's versions (None: PyPI could not be asked; then the
    clone's tags of vLLM's own shape stand in). `tags`: tag name -> commit.
    Finals (and post releases) come from PyPI only: a version-looking tag
    PyPI does not list (`v0.10.0.0`, `2024.06.25`) is not a release. rc tags
    are not uploaded to PyPI; one counts when PyPI lists its final, or when
    its final is newer than every listed one (the release being prepared).
    """
    by_version: dict[str, tuple[ReleaseName, str, str]] = {}
    for tag, commit in tags.items():
        name = parse_tag(tag)
        if name is None or name.kind not in ("final", "rc"):
            continue
        key = name.version
        if key not in by_version or tag.startswith("v"):
            by_version[key] = (name, tag, commit)
    out: dict[str, tuple[ReleaseName, str, str | None]] = {}
    if versions is None:
        for key, (name, tag, commit) in by_version.items():
            if _vllm_shape(tag):
                out[key] = (name, tag if tag.startswith("v") else f"v{tag}", commit)
    else:
        finals: list[ReleaseName] = []
        for version in versions:
            name = parse_tag(version)
            if name is None or name.kind == "dev":
                continue
            tagged = by_version.get(name.version)
            out[name.version] = (name, f"v{name.version}", tagged[2] if tagged else None)
            if name.kind == "final":
                finals.append(name)
        newest = max((n.key[0] for n in finals), default=None)
        listed = {n.key[0] for n in finals}
        for key, (name, tag, commit) in by_version.items():
            release = name.key[0]
            if name.kind == "rc" and key not in out and (release in listed or newest is None or release > newest):
                out[key] = (name, tag if tag.startswith("v") else f"v{tag}", commit)
    return sorted(out.values(), key=lambda item: item[0].key)


_VLLM_TAG = re.compile(r"^v\d{1,2}\.\d+\.\d+(?:rc\d+|\.post\d+)?$")


def _vllm_shape(tag: str) -> bool:
    """vLLM's own tag shape: v + 3 numbers, an optional rcN or .postN (never 4 numbers or dates)."""
    return bool(_VLLM_TAG.match(tag))


def first_shipped(releases: Sequence[Release], carries: Callable[[str], bool], *, list_known: bool = True,
                  merged: int | None = None) -> FirstShipped:
    """The first final and the first rc-or-final that carry the fix, each exact
    only when every earlier release was checked (and the release list is PyPI's).

    `merged`: the committer time of the fix's squash commit on main. A release
    PyPI got before then cannot carry it (a release is cut before its upload), so
    an unchecked one of those is no doubt: it is counted, not listed."""
    unchecked: list[str] = []
    excluded = 0
    first_final: Release | None = None
    first_any: Release | None = None
    unchecked_before_final: list[str] | None = None
    unchecked_before_any: list[str] | None = None
    for rel in releases:  # oldest first
        if rel.commit is None:
            if merged is not None and rel.uploaded is not None and rel.uploaded < merged:
                excluded += 1
                continue
            unchecked.append(rel.tag)
            continue
        if first_final is not None:
            break  # both answers are decided once a final carries it
        if not carries(rel.commit):
            continue
        if first_any is None:
            first_any, unchecked_before_any = rel, list(unchecked)
        if rel.final:
            first_final, unchecked_before_final = rel, list(unchecked)
    if first_final is None:
        unchecked_before_final = unchecked
    exact_final = list_known and not unchecked_before_final
    exact_any = list_known and not unchecked_before_any
    final_tag = first_final.tag if first_final else None
    any_tag = first_any.tag if first_any else None
    # an unchecked release before the answer could be the true first one
    relevant = sorted(set(unchecked_before_final or ()) | set(unchecked_before_any or ()),
                      key=lambda t: parse_tag(t).key if parse_tag(t) else ())  # type: ignore[union-attr]
    return FirstShipped(
        first_release=final_tag if exact_final else None,
        first_release_at_most=None if exact_final else final_tag,
        first_rc=any_tag if exact_any else None,
        first_rc_at_most=None if exact_any else any_tag,
        unchecked=tuple(relevant),
        excluded_before_merge=excluded,
    )
