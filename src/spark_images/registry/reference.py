"""The one image reference grammar of the project (OCI distribution), parsed once.

    reference  := host [":" port] "/" path [":" tag] ["@" digest]
    host       := domain-name | IPv4 | "[" IPv6 "]"
    path       := component ("/" component)*
    component  := [a-z0-9]+ ((\\.|_|__|-+) [a-z0-9]+)*
    tag        := [\\w][\\w.-]{0,127}      (ASCII word characters)
    digest     := sha256:[a-f0-9]{64}

The registry host is required: this tool never guesses docker.io. Its first
component counts as a host when it has a dot, a port, brackets, or is
`localhost` (the distribution library's own rule), so `[::1]:5000/x` is a
registry reference and `main/x` is not. Every check is a full match, so a
trailing newline never slips through. Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from spark_images.core.errors import UsageError
from spark_images.core.inputs import DIGEST, short

_COMPONENT = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[0-9a-fA-F:.]+\])(?::[0-9]{{1,5}})?"
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
PATH = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
HOST = re.compile(_HOST)
_REFERENCE = re.compile(
    rf"(?P<host>{_HOST})/(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    rf"(?::(?P<tag>{TAG.pattern}))?(?:@(?P<digest>{DIGEST.pattern}))?"
)
NAME_MAX = 255  # host + "/" + path, as the distribution library limits it
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
EXAMPLE = "HOST/REPO[:TAG][@sha256:HEX], e.g. ghcr.io/OWNER/spark-vllm:cu130 or 127.0.0.1:5000/spark-vllm"


class BadReference(UsageError):
    """Text that is not an image reference in the distribution grammar (exit 2)."""


def is_tag(text: str) -> bool:
    return TAG.fullmatch(text) is not None


def is_digest(text: str) -> bool:
    return DIGEST.fullmatch(text) is not None


def _host_part(text: str) -> str:
    return text.split("/", 1)[0]


def names_registry(text: str) -> bool:
    """True when TEXT starts with a registry host: a dot, a port, brackets or localhost."""
    first, sep, rest = text.partition("/")
    return bool(sep and rest) and ("." in first or ":" in first or first.startswith("[") or first == "localhost")


def hostname_of(host: str) -> str:
    """`HOST[:PORT]` -> HOST, with IPv6 brackets removed (`[::1]:5000` -> `::1`)."""
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if ":" in host else host


def is_loopback(host: str) -> bool:
    """HOST[:PORT] names this machine: such registries speak plain HTTP."""
    return hostname_of(host) in LOOPBACK


def _why_not(text: str) -> str:
    """The first reason TEXT is not a reference (for one clear line)."""
    if any(ch.isspace() for ch in text) or not text.isprintable():
        return "it holds whitespace or control characters"
    if not names_registry(text):
        return "it does not start with a registry host (a dot, a port or localhost)"
    host, _, rest = text.partition("/")
    if HOST.fullmatch(host) is None:
        return f"{host[:80]!r} is not a registry host[:port]"
    name, _, digest = rest.partition("@")
    if digest and not is_digest(digest):
        return f"{digest[:80]!r} is not a sha256 digest (sha256: + 64 lower-case hex)"
    path, tag = name, ""
    if ":" in name.rsplit("/", 1)[-1]:
        path, _, tag = name.rpartition(":")
        if not is_tag(tag):
            return f"{tag[:80]!r} is not a valid tag (letters, digits, '_', '.', '-'; at most 128; not starting with '.' or '-')"
    if PATH.fullmatch(path) is None:
        return f"{path[:80]!r} is not a valid repository name (lower-case components separated by '/')"
    return f"it is longer than {NAME_MAX} characters"


@dataclass(frozen=True)
class ImageReference:
    """A parsed reference: registry host (with port), repository path, tag and/or digest."""

    host: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    # --- parsing -------------------------------------------------------------------

    @classmethod
    def parse_or_none(cls, text: str) -> ImageReference | None:
        m = _REFERENCE.fullmatch(text) if names_registry(text) else None
        if m is None or len(m.group("host")) + 1 + len(m.group("path")) > NAME_MAX:
            return None
        return cls(m.group("host"), m.group("path"), m.group("tag"), m.group("digest"))

    @classmethod
    def parse(
        cls,
        text: str,
        *,
        what: str = "",
        allow_tag: bool = True,
        allow_digest: bool = True,
    ) -> ImageReference:
        """The reference TEXT names, or BadReference with one line (prefixed by `what`)."""
        shown = short(text)
        label = f"{what} {shown}" if what else shown
        ref = cls.parse_or_none(text)
        if ref is None:
            raise BadReference(f"{label}: not an image reference: {_why_not(text)} (fix: write {EXAMPLE})")
        if ref.digest and not allow_digest:
            raise BadReference(f"{label}: give a repository (HOST/NAME[:TAG]); the digest comes from the build")
        if ref.tag and not allow_tag:
            raise BadReference(f"{label}: give a repository without a tag (HOST/NAME)")
        return ref

    @staticmethod
    def problem(text: str) -> str | None:
        """None when TEXT parses; otherwise why not (for Problem lines)."""
        return None if ImageReference.parse_or_none(text) is not None else _why_not(text)

    # --- views ----------------------------------------------------------------------

    @property
    def name(self) -> str:
        """HOST/REPOSITORY: what a lock entry's `repository` holds."""
        return f"{self.host}/{self.repository}"

    @property
    def reference(self) -> str:
        """What the manifests endpoint takes: the digest, else the tag, else `latest`."""
        return self.digest or self.tag or "latest"

    @property
    def hostname(self) -> str:
        return hostname_of(self.host)

    @property
    def is_loopback(self) -> bool:
        return is_loopback(self.host)

    @property
    def scheme(self) -> str:
        return "http" if self.is_loopback else "https"

    @property
    def api_base(self) -> str:
        """`SCHEME://HOST/v2/REPOSITORY` of the distribution API."""
        return f"{self.scheme}://{self.host}/v2/{self.repository}"

    @property
    def pinned(self) -> str:
        """HOST/REPOSITORY@DIGEST; ValueError when there is no digest."""
        if not self.digest:
            raise ValueError(f"{self} has no digest")
        return f"{self.name}@{self.digest}"

    def __str__(self) -> str:
        return self.name + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")
