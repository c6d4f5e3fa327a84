"""Why a buildx build failed, read from its plain progress output (pure).

A failed build is either a finding about the input (the Dockerfile, a pin
that does not exist: exit 1) or an environment that cannot fetch what the
build needs (exit 2). BuildKit prints the step's own output as
`#10 85.46 <line>`, and the final `ERROR: failed to solve: process ... did
not complete successfully` says only that a step failed; the cause is in the
step's lines (pip's `ERROR: ...`, its `Retrying ... after connection broken
by ...` warnings, curl's `Could not resolve host`). So the whole tail is
searched for the signatures below, and the line that carries one is quoted.

The remedies differ and must not be mixed: a TLS failure behind an
intercepting proxy is cured by `--ca-cert FILE`; a host that does not
resolve is not, so it is never told to try one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from spark_images.core.inputs import short

TLS = "tls"
TLS_ENGINE = "tls-engine"  # BuildKit itself (pulling the base image), not a RUN step
DNS = "dns"
PROXY = "proxy"
NETWORK = "network"

# (kind, case-insensitive substrings), most specific first: a line is given
# the first kind whose sign it carries
SIGNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (TLS, (
        "certificate_verify_failed", "certificate verify failed", "sslcertverificationerror", "sslerror",
        "ssl: wrong_version_number", "x509: certificate", "tls: failed to verify certificate",
        "unable to get local issuer certificate", "self-signed certificate", "self signed certificate",
        "server certificate verification failed",
    )),
    (DNS, (
        "temporary failure in name resolution", "name or service not known", "could not resolve host",
        "no such host", "nodename nor servname provided", "getaddrinfo failed", "nameresolutionerror",
        "could not resolve proxy", "no address associated with hostname",
    )),
    (PROXY, ("proxyerror", "tunnel connection failed", "407 proxy authentication required", "proxy error")),
    (NETWORK, (
        "connection refused", "connection reset by peer", "network is unreachable", "no route to host",
        "i/o timeout", "connection timed out", "read timed out", "connecttimeouterror", "newconnectionerror",
        "failed to establish a new connection", "max retries exceeded", "dial tcp",
        "failed to resolve source metadata", "failed to do request",
    )),
)  # fmt: skip

# `#10 85.46 text`: a line a build step printed (BuildKit plain progress)
_STEP_LINE = re.compile(r"^#\d+ \d+(\.\d+)? ")

# kind -> (what happened, the fix)
REMEDY: dict[str, tuple[str, str]] = {
    TLS: (
        "a download inside the build could not verify a TLS certificate, as behind a TLS-intercepting proxy",
        "pass --ca-cert FILE with the proxy's CA bundle (PEM)",
    ),
    TLS_ENGINE: (
        "the engine could not verify the TLS certificate of a registry while resolving an image",
        "make the Docker engine trust that registry's CA (/etc/docker/certs.d/HOST/ca.crt or the host's CA "
        "store, then restart dockerd); --ca-cert reaches only the build's RUN steps",
    ),
    DNS: (
        "a host the build needs does not resolve",
        "check the network and DNS of the Docker engine, and the host names the profile gives: index URLs, "
        "wheel URL, base image registry",
    ),
    PROXY: (
        "the proxy refused or failed a download",
        "check HTTP_PROXY / HTTPS_PROXY / NO_PROXY of the engine and of buildx, and the proxy's credentials",
    ),
    NETWORK: (
        "the engine cannot reach a registry or package index the build needs",
        "build where the pinned base image and the package indexes are reachable",
    ),
}


# BuildKit's words when it cannot resolve a FROM image (the pinned base)
BASE_PULL_SIGN = "failed to resolve source metadata for"
BASE_PULL_HINT = (
    "; a host that cannot pull the pinned base can still see the main job work: "
    "`nox -s acceptance` builds the same lock on a local stand-in base"
)


@dataclass(frozen=True)
class Cause:
    """An environment cause found in the output, with the lines that show it."""

    kind: str  # TLS, TLS_ENGINE, DNS, PROXY or NETWORK
    line: str  # the line carrying the sign, as BuildKit printed it
    error_line: str = ""  # the step's own ERROR line, when another line carries the sign
    base_pull: bool = False  # the engine could not resolve a FROM image

    @property
    def what(self) -> str:
        what = REMEDY[self.kind][0]
        return f"{what} (the pinned base image could not be pulled)" if self.base_pull else what

    @property
    def fix(self) -> str:
        return REMEDY[self.kind][1] + (BASE_PULL_HINT if self.base_pull else "")

    def quote(self) -> str:
        quoted = f"`{short(self.line, 400)}`"
        if self.error_line and self.error_line != self.line:
            quoted += f", then `{short(self.error_line, 400)}`"
        return quoted


def kind_of(line: str) -> str | None:
    """The environment kind a single output line signals, or None."""
    low = line.lower()
    for kind, signs in SIGNS:
        if any(sign in low for sign in signs):
            return kind
    return None


def step_error_lines(lines: Sequence[str]) -> list[str]:
    """Lines in which a step itself reported an error (`#10 85.46 ERROR: ...`)."""
    out = []
    for raw in lines:
        line = raw.strip()
        if _STEP_LINE.match(line) and re.search(r"\b(ERROR|error|E):", line.split(" ", 2)[-1][:12]):
            out.append(line)
    return out


def environment_cause(lines: Sequence[str]) -> Cause | None:
    """The environment cause of a failed build's output, or None (then it is a finding).

    Kinds are tried most specific first (TLS before DNS before proxy before a
    plain connection error), so one line of each never hides the precise one.
    A `No matching distribution` alone is a finding (the pin does not exist);
    after a connection error it is that error's consequence.
    """
    stripped = [line.strip() for line in lines if line.strip()]
    step_errors = step_error_lines(stripped)
    last_error = step_errors[-1] if step_errors else ""
    for kind, _signs in SIGNS:
        hits = [line for line in stripped if kind_of(line) == kind]
        if not hits:
            continue
        # quote the step's own line (pip's ERROR or warning) before BuildKit's summary
        steps = [line for line in hits if _STEP_LINE.match(line)]
        line = (steps or hits)[0]
        if kind == TLS and not steps:
            kind = TLS_ENGINE
        base_pull = not steps and BASE_PULL_SIGN in line.lower()
        return Cause(kind, line, "" if line in step_errors else last_error, base_pull)
    return None


def error_summary(lines: Sequence[str]) -> str:
    """The lines that say what failed: the step's own errors, then BuildKit's."""
    stripped = [line.strip() for line in lines if line.strip()]
    steps = step_error_lines(stripped)
    final = [line for line in stripped if line.startswith(("ERROR", "error:")) or re.match(r"^#\d+ ERROR:", line)]
    picked = list(dict.fromkeys([*steps[-3:], *final]))
    if not picked:
        picked = stripped[-5:]
    return " | ".join(short(line, 400) for line in picked)[-2000:] or "buildx failed without a message"


_NO_DIST = re.compile(r"No matching distribution found for (\S+)")
_STEP_ID = re.compile(r"^#(\d+) ")
# a step's header: `#12 [installer 2/3] ...`, `#14 [installer-torch 3/3] ...`, `#9 [linux/amd64 installer-vllm 2/3] ...`
_INSTALLER_HEADER = re.compile(r"^#(\d+) \[(?:\S+ )?installer(?:-[A-Za-z0-9._-]+)? \d+/\d+\] ")


def lock_entry_without_wheel(lines: Sequence[str]) -> str | None:
    """The lock entry the native installer stage found no linux/arm64 wheel for, or None.

    The installer runs pip with --only-binary=:all:, so an entry that PyPI serves
    only as an sdist (or without an aarch64 wheel) ends in pip's `No matching
    distribution found for NAME==V` inside a step of an `installer` stage (one per
    lock layer: `installer-LAYER`).
    """
    installer_steps = set()
    for raw in lines:
        line = raw.strip()
        step = _STEP_ID.match(line)
        if header := _INSTALLER_HEADER.match(line):
            installer_steps.add(header.group(1))
        hit = _NO_DIST.search(line)
        if hit and step and step.group(1) in installer_steps:
            return hit.group(1)
    return None
