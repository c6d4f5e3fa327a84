"""Where the stand-in vLLM server lives and a free loopback port, for the conftest and
the tests that start the stand-in themselves (imported by name, never through
`conftest`, which names whichever folder's conftest pytest loaded last)."""

from __future__ import annotations

import socket
from pathlib import Path

FAKE_PATH = Path(__file__).resolve().with_name("fake_vllm.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
