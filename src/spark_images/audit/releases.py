"""Release names: tag parsing and PEP 440 ordering (pure). The network lookup
that turns a release into its commit (the sdist's `vllm/_version.py`) lives in
`pypi_releases.py` (which imports this pure module, never the other way).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_TAG = re.compile(
    r"^v?(?P<release>\d+(?:\.\d+)*)"
    r"(?:(?P<pre>rc|a|b)(?P<pre_n>\d+))?"
    r"(?:\.post(?P<post>\d+))?"
    r"(?:\.dev(?P<dev>\d+))?$"
)
_COMMIT_ID = re.compile(r"""__commit_id__\s*=\s*(?:commit_id\s*=\s*)?['"]g?([0-9a-f]{7,40})['"]""")
_VERSION_LINE = re.compile(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""")
_LOCAL_SHA = re.compile(r"\+g([0-9a-f]{7,40})(?:$|[.+])")


@dataclass(frozen=True, order=True)
class ReleaseName:
    """A release tag: `v0.22.1rc0`, `v0.22.1`, `0.9.0.1`, `v0.8.5.post1`."""

    key: tuple[object, ...]
    tag: str
    kind: str  # "final", "rc", "pre" (a/b), "dev"

    @property
    def version(self) -> str:
        return self.tag[1:] if self.tag.startswith("v") else self.tag


def parse_tag(tag: str) -> ReleaseName | None:
    m = _TAG.match(tag)
    if not m:
        return None
    release = tuple(int(x) for x in m.group("release").split("."))
    release = release + (0,) * (4 - len(release)) if len(release) < 4 else release
    pre = m.group("pre")
    dev = m.group("dev")
    if dev is not None:
        kind = "dev"
    elif pre == "rc":
        kind = "rc"
    elif pre:
        kind = "pre"
    else:
        kind = "final"
    # PEP 440: X.YrcN < X.Y < X.Y.postN; a dev release sorts before its base
    pre_rank = {"a": 0, "b": 1, "rc": 2}.get(pre or "", 3)
    key = (
        release,
        pre_rank if dev is None or pre else -1,
        int(m.group("pre_n") or 0),
        int(m.group("post") or -1),
        int(dev) if dev is not None else 1 << 30,
    )
    return ReleaseName(key=key, tag=tag, kind=kind)


def first_release_and_rc(tags: Iterable[str]) -> tuple[str | None, str | None]:
    """The lowest final release and the lowest rc among tags that contain a fix."""
    finals: list[ReleaseName] = []
    rcs: list[ReleaseName] = []
    for tag in tags:
        name = parse_tag(tag)
        if name is None:
            continue
        if name.kind == "final":
            finals.append(name)
        elif name.kind == "rc":
            rcs.append(name)
    return (min(finals).tag if finals else None, min(rcs).tag if rcs else None)


def tag_candidates(version: str) -> list[str]:
    v = version[1:] if version.startswith("v") else version
    return [f"v{v}", v]


def parse_version_file(text: str) -> tuple[str | None, str | None]:
    """(version, commit hex) from a setuptools-scm `_version.py`.

    Release builds record `__commit_id__ = commit_id = 'g98dff2a81'` (g + 9
    hex); dev builds also carry the commit in the local version `+g<sha>`.
    """
    version_m = _VERSION_LINE.search(text)
    version = version_m.group(1) if version_m else None
    commit_m = _COMMIT_ID.search(text)
    if commit_m:
        return version, commit_m.group(1)
    if version:
        local = _LOCAL_SHA.search(version)
        if local:
            return version, local.group(1)
    return version, None


def sdist_url(index_doc: dict[str, object], version: str) -> str | None:
    """The sdist URL of `version` in a PEP 691 simple-index JSON document."""
    name = f"vllm-{version}.tar.gz"
    for entry in index_doc.get("files", []) or []:  # type: ignore[union-attr]
        if isinstance(entry, dict) and entry.get("filename") == name and not entry.get("yanked"):
            return str(entry.get("url"))
    return None
