"""What each profile string may be: the grammars and value checks the profile schema applies (pure).

Every pattern is used with re.fullmatch, so a trailing newline never passes.
Versions are PEP 440 where pip compares them; image references use the one
grammar of `registry/reference.py`; URLs are parsed by urllib (https or file,
no whitespace, quotes, `$` or backticks); paths stay inside the project.
`profiles.py` builds the schema from these; the toolchain rules, the lock and
the monitor use the same patterns.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

from packaging.version import InvalidVersion, Version

from spark_images.profiles.schema import Field, show
from spark_images.registry.reference import ImageReference, names_registry

# Every pattern is used with re.fullmatch (a trailing newline never passes).
HEX40 = re.compile(r"[0-9a-f]{40}\Z")  # \Z: callers that use .match() get a full match too
VERSION = re.compile(r"\d+(\.\d+)*([a-z0-9.+-]*)")
# what NVIDIA numbers a toolkit with (nvidia/cuda tags, nvcc's "release X.Y"): no 4th part, no suffix
CUDA_VERSION = re.compile(r"\d{1,3}\.\d{1,3}(?:\.\d{1,4})?")
PYTHON_VERSION = re.compile(r"3\.\d{1,2}")
NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")
DEBIAN_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+")  # Debian policy 5.6.1
ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# one path component: letters, digits and . _ + - (no quoting needed anywhere)
_PART = r"[A-Za-z0-9_+-][A-Za-z0-9._+-]*|\.[A-Za-z0-9_+-][A-Za-z0-9._+-]*"
RELATIVE_PATH = re.compile(rf"(?:{_PART})(?:/(?:{_PART}))*")
ABSOLUTE_PATH = re.compile(rf"(?:/(?:{_PART}))+/?")
GLOB = re.compile(r"[A-Za-z0-9._+*?\[\]-]+(?:/[A-Za-z0-9._+*?\[\]-]+)*")
MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(?:/[A-Za-z0-9][A-Za-z0-9._-]*)?")  # ORG/NAME as the Hub spells it
BACKEND = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
ARCH_LIST = re.compile(r"[A-Za-z0-9.+]+(?:[; ]+[A-Za-z0-9.+]+)*")  # tokens are judged by the toolchain rules
# RFC 3986 characters, less quotes and `$` (a URL never needs them; percent-encode)
URL_CHARS = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!&()*+,;=%]+")
ONE_LINE = re.compile(r"[^\x00-\x1f\x7f]*")  # printable text, no newline or control character
STRATEGIES = ("source", "wheel")
URL_SCHEMES = ("https", "file")


def matching(regex: re.Pattern[str], what: str, **kw: Any) -> Field:
    """A string field that must fully match `regex`."""
    return Field(str, pattern=regex.pattern, what=what, **kw)


def between(minimum: int, maximum: int) -> Any:
    def check(value: Any) -> str | None:
        if value < minimum:
            return f"{value} must be at least {minimum}"
        return f"{value} must be at most {maximum}" if value > maximum else None

    check.minimum, check.maximum = minimum, maximum  # type: ignore[attr-defined]
    return check


def pep440_problem(value: Any) -> str | None:
    """Python package versions must also be PEP 440 (pip compares them that way)."""
    try:
        Version(value)
    except InvalidVersion:
        return f"{show(value)} is not a PEP 440 version"
    return None


def url_problem(value: str) -> str | None:
    """Why VALUE is not an https or file URL we will put in a Dockerfile, or None."""
    if URL_CHARS.fullmatch(value) is None:
        return f"{show(value)} is not a URL: it holds whitespace, quotes, $, backticks or other characters a URL never needs (percent-encode them)"
    try:
        parts = urllib.parse.urlsplit(value)
        _ = parts.port  # a port that is not a number raises
    except ValueError as exc:
        return f"{show(value)} is not a URL ({exc})"
    if parts.scheme not in URL_SCHEMES:
        return f"{show(value)} is not an https or file URL"
    if parts.scheme == "https" and not parts.hostname:
        return f"{show(value)} is not an https URL with a host"
    if parts.scheme == "file" and (parts.netloc not in ("", "localhost") or not parts.path.startswith("/")):
        return f"{show(value)} is not a file URL (file:///ABSOLUTE/PATH)"
    return None


def url_check(value: Any) -> str | None:
    return url_problem(value)


def base_image_reference(text: str) -> ImageReference | None:
    """The base image as a reference; a name without a registry host means Docker Hub,
    as it does to FROM (`nvidia/cuda:...` is `docker.io/nvidia/cuda:...`)."""
    return ImageReference.parse_or_none(text if names_registry(text) else f"docker.io/{text}")


def base_image_problem(value: Any) -> str | None:
    if base_image_reference(value) is None:
        why = ImageReference.problem(value if names_registry(value) else f"docker.io/{value}")
        return f"{show(value)} is not an image reference ({why})"
    return None


def repository_problem(value: Any) -> str | None:
    if not names_registry(value):  # parse_or_none alone takes `owner/name` as host/path
        return f"{show(value)} is not an image repository (it does not start with a registry host, e.g. ghcr.io/OWNER/NAME)"
    why = ImageReference.problem(value)
    if why is not None:
        return f"{show(value)} is not an image repository ({why})"
    ref = ImageReference.parse_or_none(value)
    if ref is not None and (ref.tag or ref.digest):
        return f"{show(value)} names a tag or digest; give the repository only (tags are set by publish)"
    return None


def project_path_problem(value: Any) -> str | None:
    """Paths in a profile are relative to the project and stay inside it."""
    if value.startswith("/"):
        return f"{show(value)} is an absolute path; name it relative to the folder that holds profiles/"
    if ".." in value.split("/"):
        return f"{show(value)} leaves the project (..); name a file inside it"
    return None


def relative_path(what: str, **kw: Any) -> Field:
    return Field(str, pattern=RELATIVE_PATH.pattern, what=what, check=project_path_problem, **kw)
