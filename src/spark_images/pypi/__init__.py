"""The PyPI room: the only package that speaks to a Python package index.

`wheels` holds the rules (requirement strings, PEP 503 names, which file of an
index page is the linux wheel of a version) and does no I/O; `client` reads
index pages, downloads wheels into the cache and reads them by range. It may
import `core`, `defaults` and `registry.http` (the bounded HTTP helpers), and
nothing above them. Callers use the names below as `pypi.NAME`.
"""

from spark_images.pypi.client import (
    SIMPLE_JSON,
    HttpRangeFile,
    Progress,
    RangeReadError,
    cache_root,
    cached,
    cached_path,
    download,
    index_url,
    project_index,
    resolve,
    stream,
)
from spark_images.pypi.wheels import WheelFile, normalize, parse_requirement, pick_wheel, wheel_rank

__all__ = [
    "SIMPLE_JSON", "HttpRangeFile", "Progress", "RangeReadError", "WheelFile", "cache_root", "cached",
    "cached_path", "download", "index_url", "normalize", "parse_requirement", "pick_wheel", "project_index",
    "resolve", "stream", "wheel_rank",
]  # fmt: skip
