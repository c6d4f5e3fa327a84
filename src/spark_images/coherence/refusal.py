"""vLLM's own reason for refusing to start, read from its output (pure).

Real vLLM 0.26 refuses in two ways that must not look like a slow start:
argparse exits 2 at once (after ~30 s of imports) with
`error: argument --moe-backend: invalid choice: 'x' (choose from 'aiter', ...)`
or `error: unrecognized arguments: --x`, and the config check exits 1 with a
line such as `Value error, User-specified max_model_len (100000) is greater
than the derived max_model_len ...` (or CUDA running out of memory). This
module turns those lines into one finding that names the flag, vLLM's
choices, or vLLM's own line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_PREFIX = re.compile(r"^\(\w+ pid=\d+\)\s*")  # "(APIServer pid=830) "
_INVALID_CHOICE = re.compile(r"error: argument (?P<flag>[-\w/ ]+): invalid choice: (?P<value>'[^']*') \(choose from (?P<choices>.*)\)")
_UNRECOGNIZED = re.compile(r"error: unrecognized arguments: (?P<args>.+)$")
_ARG_ERROR = re.compile(r"error: argument (?P<flag>[-\w/ ]+): (?P<why>.+)$")
_CONFIG = (
    re.compile(r"Value error, (?P<line>.+?)(?: \[type=value_error.*)?$"),
    re.compile(r"(?:ValueError|RuntimeError|AssertionError): (?P<line>.+)$"),
    re.compile(r"(?P<line>(?:torch\.)?(?:cuda\.)?OutOfMemoryError: .+|CUDA out of memory.+)$"),
)


def refusal(lines: Iterable[str]) -> str | None:
    """The finding for vLLM's refusal in its output, or None when it gave none."""
    config: str | None = None
    for raw in lines:
        line = _PREFIX.sub("", raw.rstrip())
        if m := _INVALID_CHOICE.search(line):
            return (f"vLLM refused {m['flag']} {m['value']}: not one of its choices ({m['choices'][:400]}) "
                    f"(fix: give {m['flag']} one of those)")  # fmt: skip
        if m := _UNRECOGNIZED.search(line):
            return f"vLLM does not know the argument(s) {m['args'][:200]} (fix: drop them or check `vllm serve --help`)"
        if m := _ARG_ERROR.search(line):
            return f"vLLM refused {m['flag']}: {m['why'][:300]}"
        if config is None:
            for pattern in _CONFIG:
                if m := pattern.search(line):
                    config = m["line"][:400]
                    break
    return f"vLLM refused to start: {config}" if config else None
