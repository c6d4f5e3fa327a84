"""buildx builds: linux/arm64, reproducible OCI export, streamed progress.

The one export that gives the same digest twice with the engine we target
(26.x, containerd image store, `docker` driver) is an OCI archive written
with `rewrite-timestamp=true` and SOURCE_DATE_EPOCH: `type=image` and
`type=registry` refuse `rewrite-timestamp` there ("conflicts with unpack").
So a build writes an OCI archive; `registry.push` uploads it unchanged and
`load_oci` puts it into the local engine. The digest is read from the buildx
metadata file (`containerimage.digest`), never from a tag.

The build runs the docker CLI that python-on-whales is configured with, but
under our own `Popen`: python-on-whales' log streamer leaves the docker child
running when the reader is interrupted, and an interrupted build must stop
the child before the partial archive is removed.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform as host
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from python_on_whales.exceptions import DockerException

from spark_images import defaults
from spark_images.core.errors import EnvironmentProblem, SparkImagesError
from spark_images.engine import ENGINE_FIX, client, failures, require_engine
from spark_images.registry.reference import ImageReference, names_registry

BINFMT_AARCH64 = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
QEMU_FIX = (
    "register arm64 emulation: on Debian `apt-get install qemu-user-static binfmt-support && "
    "update-binfmts --enable qemu-aarch64` (or build on an arm64 host)"
)
BUILDX_FIX = "install the buildx plugin (Debian 13: `apt-get install docker-buildx`; or run .ci/engine-up.sh)"

# The export writes every layer twice (once as built, once with its file times
# clamped by rewrite-timestamp) and compresses both. zstd at BuildKit's level 3
# is klauspost's SpeedDefault: by that library's own figures faster than Go's
# gzip at level 1 (220 against 159 MB/s on an 8.5 GB VM image) and 15% smaller,
# and it unpacks several times faster, on a Spark as in `check`.
# It is deterministic: klauspost/compress promises the same output from the same
# code version, whatever the concurrency. Docker 23+ and containerd 1.5+ pull it.
EXPORT_COMPRESSION = "compression=zstd,compression-level=3"

LogSink = Callable[[str], None]


def unreachable_source(error_text: str) -> bool:
    """Whether a failed build's errors say a registry or index was unreachable."""
    return failures.environment_cause(error_text.splitlines()) is not None


class BuildFailed(SparkImagesError):
    """buildx ran and the build failed (a finding about the input: exit 1)."""

    exit_code = 1


class BuildEnvironmentFailed(EnvironmentProblem):
    """buildx ran and the build failed for a cause outside the input (exit 2).

    `cause` holds the kind (tls, dns, proxy, network) and the quoted lines.
    """

    def __init__(self, message: str, cause: failures.Cause) -> None:
        super().__init__(message)
        self.cause = cause


@dataclass(frozen=True)
class Secret:
    """A BuildKit secret: `id` as the Dockerfile mounts it, `src` a host file."""

    id: str
    src: Path


@dataclass(frozen=True)
class BuildRequest:
    context: Path
    dockerfile: Path
    oci_dest: Path
    metadata_file: Path
    image_name: str
    source_date_epoch: int
    build_args: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    secrets: tuple[Secret, ...] = ()
    cache_from: tuple[str, ...] = ()
    cache_to: str | None = None
    no_cache: bool = False
    platform: str = defaults.TARGET_PLATFORM


@dataclass(frozen=True)
class BuildResult:
    digest: str
    config_digest: str
    oci_archive: Path
    metadata: dict[str, Any]
    seconds: float
    emulated: bool


# every layer (mode=max); a cache export that fails (BuildKit's cache export to a
# client directory is cancelled now and then: docker/buildx#713) is logged by
# BuildKit and never fails a build whose image is already exported: the cache is
# a speed-up, the image and its digest do not depend on it
CACHE_EXPORT = "mode=max,ignore-error=true"


def cache_specs(where: str, exists: bool) -> tuple[str, str]:
    """(cache-from, cache-to) buildx specs for a local directory or a registry ref.

    A value with `type=` is passed through as written. Otherwise an existing
    path, or one that starts like a path, is a local directory; a value whose
    first component names a registry host (the one reference grammar's rule:
    a dot, a port, brackets or localhost) is a registry ref and must parse as
    one (BadReference, exit 2, otherwise); anything else is a local directory.
    A written `type=` value is the user's to set `ignore-error` on.
    """
    if "type=" in where:
        return where, where
    if exists or where.startswith(("/", "./", "../", "~")) or not names_registry(where):
        return f"type=local,src={where}", f"type=local,dest={where},{CACHE_EXPORT}"
    ref = ImageReference.parse(where, what="--cache")
    return f"type=registry,ref={ref}", f"type=registry,ref={ref},{CACHE_EXPORT}"


def emulation() -> bool:
    """True when linux/arm64 runs under qemu here; EnvironmentProblem when it cannot run."""
    if host.machine().lower() in ("aarch64", "arm64"):
        return False
    try:
        enabled = BINFMT_AARCH64.read_text().splitlines()[0].strip() == "enabled"
    except (OSError, IndexError):
        enabled = False
    if not enabled:
        raise EnvironmentProblem(
            f"this {host.machine()} host cannot run linux/arm64 build steps: no qemu-aarch64 "
            f"binfmt handler ({QEMU_FIX})"
        )
    return True


@functools.cache
def require_buildx() -> list[str]:
    """The docker command prefix, once the engine and buildx both answer (else exit 2).

    Checked once per process (each check is a docker CLI round trip); a
    failure is not cached, so a later call checks again.
    """
    docker = require_engine()
    try:
        docker.buildx.version()
    except DockerException as exc:
        raise EnvironmentProblem(f"docker buildx does not answer ({BUILDX_FIX})") from exc
    except FileNotFoundError as exc:
        raise EnvironmentProblem(f"no docker command ({ENGINE_FIX})") from exc
    return [str(part) for part in docker.client_config.docker_cmd]


def buildx_argv(req: BuildRequest) -> list[str]:
    """The `buildx build` arguments for a request (pure)."""
    out = f"type=oci,dest={req.oci_dest},name={req.image_name},rewrite-timestamp=true,{EXPORT_COMPRESSION}"
    argv = [
        "buildx", "build", str(req.context),
        "--file", str(req.dockerfile),
        "--platform", req.platform,
        "--progress", "plain",
        # Provenance attestations carry build times and host details, which
        # would change the digest on every build; attestation belongs to publish.
        "--provenance", "false",
        "--sbom", "false",
        "--metadata-file", str(req.metadata_file),
        "--output", out,
    ]  # fmt: skip
    # BuildKit reads SOURCE_DATE_EPOCH as a build argument as well as from
    # buildx's environment; passing it explicitly keeps the request complete.
    args = {**req.build_args, "SOURCE_DATE_EPOCH": str(req.source_date_epoch)}
    for key in sorted(args):
        argv += ["--build-arg", f"{key}={args[key]}"]
    for key in sorted(req.labels):
        argv += ["--label", f"{key}={req.labels[key]}"]
    for secret in req.secrets:
        argv += ["--secret", f"id={secret.id},src={secret.src}"]
    for spec in req.cache_from:
        argv += ["--cache-from", spec]
    if req.cache_to:
        argv += ["--cache-to", req.cache_to]
    if req.no_cache:
        argv.append("--no-cache")
    return argv


def _stop(proc: subprocess.Popen[str]) -> None:
    """Stop a buildx child and everything it started; BuildKit cancels the solve."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


def _discard(req: BuildRequest) -> None:
    """Remove what a build that did not succeed may have left: the archive and the metadata."""
    req.oci_dest.unlink(missing_ok=True)
    req.metadata_file.unlink(missing_ok=True)


def failed_build(code: int, tail: list[str]) -> SparkImagesError:
    """The exception for a build that exited `code`: environment (exit 2) or finding (exit 1)."""
    cause = failures.environment_cause(tail)
    if cause is not None:
        return BuildEnvironmentFailed(
            f"docker buildx build exited {code}: {cause.what}: {cause.quote()} (fix: {cause.fix})", cause
        )
    entry = failures.lock_entry_without_wheel(tail)
    if entry is not None:
        return BuildFailed(
            f"requirements lock: {entry} has no wheel for linux/arm64 (only an sdist, or no aarch64 wheel): "
            "the image installs locked wheels only (fix: build a wheel of it and lock that file's sha256, "
            "or drop the entry)"
        )
    return BuildFailed(f"docker buildx build exited {code}: {failures.error_summary(tail)}")


def build(req: BuildRequest, on_log: LogSink | None = None) -> BuildResult:
    """Run the build, streaming progress lines to `on_log`; return the digest.

    Raises EnvironmentProblem (no engine/buildx/emulation), BuildFailed (the
    build itself failed). On any exception, including KeyboardInterrupt, the
    buildx child is stopped and the partial archive and metadata are removed.
    """
    docker_cmd = require_buildx()
    emulated = emulation() if req.platform == defaults.TARGET_PLATFORM else False
    for missing in [s for s in req.secrets if not Path(s.src).is_file()]:
        raise EnvironmentProblem(f"secret {missing.id!r}: no file at {missing.src}")
    req.oci_dest.parent.mkdir(parents=True, exist_ok=True)
    req.metadata_file.unlink(missing_ok=True)
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(req.source_date_epoch)}
    started = time.monotonic()
    tail: list[str] = []
    proc = subprocess.Popen(
        [*docker_cmd, *buildx_argv(req)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        env=env,
        # own process group: a Ctrl-C meant for us is handled here, once
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            del tail[:-400]
            if on_log is not None:
                on_log(line.rstrip("\n"))
        code = proc.wait()
    except BaseException:
        _stop(proc)
        _discard(req)
        raise
    finally:
        if proc.stdout is not None:
            proc.stdout.close()
    if code != 0:
        _discard(req)
        raise failed_build(code, tail)
    try:
        metadata = json.loads(req.metadata_file.read_text(encoding="utf-8"))
        digest = str(metadata["containerimage.digest"])
    except (OSError, ValueError, KeyError) as exc:
        _discard(req)
        raise BuildFailed(
            f"buildx wrote no usable metadata file at {req.metadata_file} ({exc})"
        ) from exc
    return BuildResult(
        digest=digest,
        config_digest=str(metadata.get("containerimage.config.digest", "")),
        oci_archive=req.oci_dest,
        metadata=metadata,
        seconds=time.monotonic() - started,
        emulated=emulated,
    )


def local_image_id(name: str) -> str | None:
    """The image ID (with the containerd store: the manifest digest) of a local image."""
    require_buildx()
    docker = client()
    try:
        return str(docker.image.inspect(name).id)
    except DockerException:
        return None


def load_oci(archive: Path, name: str, digest: str) -> str:
    """Load an OCI archive into the engine as `name`; return the local reference.

    Skipped when `name` already is that digest (a no-change rebuild). With the
    containerd image store the loaded image's ID is the manifest digest, so the
    image is looked up by that ID, not by `name`: two builds of one profile that
    load at once both move `name`, and the last one wins it, but each finds its
    own image. The reference returned tags that image with the digest
    (`REPO:sha256-HEX`): the next build of the profile moves `name`, never that
    tag, so a record's local image stays the image it describes.
    """
    pinned = f"{name.rpartition(':')[0]}:{digest.replace(':', '-')}"
    docker = client()
    if local_image_id(name) != digest:
        try:
            docker.image.load(str(archive), quiet=True)
        except DockerException as exc:
            raise EnvironmentProblem(f"docker load {archive} failed: {exc.stderr or exc}") from exc
        if local_image_id(digest) != digest:
            raise EnvironmentProblem(
                f"docker load of {archive} left no image with the ID {digest} (the built digest; "
                f"{name} is {local_image_id(name)}): turn on the containerd image store: "
                '/etc/docker/daemon.json {"features":{"containerd-snapshotter":true}}'
            )
    docker.image.tag(digest, pinned)
    return pinned
