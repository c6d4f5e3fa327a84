"""Read a target once and gather what `check` decides on (the I/O edge of `check`).

One pass over the target's files (through `spark_images.readers.artifacts`): small
files the inventory wants are parsed as they come; files that can hold device
code go, as the reader yields them, to the cubin parser
(`cubins.scan_members`; a multi-GB library is a mapping of the reader's
spooled file, never held in memory). The image config (env,
entrypoint, labels) comes from the registry, the engine or the archive.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from spark_images import defaults
from spark_images.check.inventory import Collector, ImageConfig, Inventory, parse_config
from spark_images.core.errors import EnvironmentProblem, SparkImagesError, UsageError
from spark_images.readers import artifacts

if TYPE_CHECKING:
    from spark_images.audit.states import AuditReport
    from spark_images.cubins.report import CubinReport

_SHARED_OBJECT = re.compile(r"\.so(\.\d+)*$")
SPOOL_OVER = 64 << 20  # members above this come as a mapping of a spooled file, not bytes
GPU_LIBRARY_KEYS = ("path", "kind", "fatbins", "native", "jit_only", "missing", "sass", "ptx", "verdict", "link_stubs", "embedded",
                    "unreadable", "kernel_classes")


def is_device_code_candidate(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return bool(_SHARED_OBJECT.search(name)) or name.endswith((".cubin", ".fatbin"))


class Sink(Protocol):
    """A reader of small files met in the pass: says which it wants, takes their bytes."""

    def wants(self, path: str) -> bool: ...

    def add(self, path: str, data: bytes) -> None: ...


@dataclass
class Gathered:
    target: str
    kind: str
    digest: str | None
    inventory: Inventory
    libraries: list[dict[str, Any]] = field(default_factory=list)
    unreadable: list[dict[str, str]] = field(default_factory=list)
    files_seen: int = 0
    cubins: CubinReport | None = None  # the device code as the cubin inspector reports it


# --- image config --------------------------------------------------------------------


def _registry_config(target: str) -> tuple[ImageConfig, str]:
    from spark_images.registry.client import RegistryClient, parse_reference

    ref = parse_reference(target)
    client = RegistryClient(ref.host, ref.repository)
    manifest = client.image_manifest(ref.reference)
    raw = client.get_blob(manifest.config, limit=8 << 20)
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise EnvironmentProblem(f"{target}: image config {manifest.config.digest} is not JSON") from exc
    return parse_config(doc), manifest.digest


def _docker_config(name: str) -> tuple[ImageConfig, str | None]:
    from spark_images.engine.images import inspect_image

    local = inspect_image(name)  # plain data; UsageError naming the image when the engine lacks it
    return parse_config(local.config_doc()), local.id


def read_config(target: str, kind: str) -> tuple[ImageConfig | None, str | None]:
    """(config, digest) of an image target; (None, None) for wheels and directories."""
    if kind == artifacts.KIND_REGISTRY:
        return _registry_config(target)
    if kind == artifacts.KIND_DOCKER:
        return _docker_config(target[len("docker://") :])
    if kind == artifacts.KIND_OCI_ARCHIVE:
        doc, digest = artifacts.archive_config(target)
        return parse_config(doc), digest
    return None, None


# --- the one pass ----------------------------------------------------------------------


def _members(
    target: str, want: artifacts.Want, progress: artifacts.Progress | None, sieve: artifacts.Sieve | None = None
) -> Iterator[artifacts.Member]:  # fmt: skip
    """Members of the target; a directory of wheels (a wheel set) is read wheel by wheel."""
    path = Path(target)
    if path.is_dir():
        wheels = sorted(path.glob("*.whl"))
        if wheels and not any(path.glob("*.dist-info")):
            for wheel in wheels:
                yield from artifacts.iter_members(str(wheel), want, progress=progress, spool_over=SPOOL_OVER)
            return
    yield from artifacts.iter_members(target, want, progress=progress, spool_over=SPOOL_OVER, sieve=sieve)


def gather(
    target: str,
    gpu: str = defaults.GPU,
    *,
    required: Sequence[str] = (),
    progress: artifacts.Progress | None = None,
    also: Sink | None = None,
    kernels: bool = False,
) -> Gathered:
    """Everything `check` needs from `target`, in one pass over its files.

    `required`: the globs of a profile's verify.native_libraries, for the
    build line's cubin gate (`Gathered.cubins.missing_required`). `also`: a
    second reader of small files in the same pass (the recipe check takes
    vLLM's .py sources this way); `kernels`: list each library's kernels.
    """
    from spark_images.cubins import scan_members
    from spark_images.cubins.sift import HostLibrarySieve
    from spark_images.cubins.verdict import parse_gpu

    try:
        parse_gpu(gpu)
    except ValueError as exc:
        raise UsageError(f"--gpu {gpu}: {exc}") from exc
    kind = artifacts.target_kind(target)
    config, digest = read_config(target, kind)
    collector = Collector(config)

    def want(path: str) -> bool:
        return collector.wants(path) or is_device_code_candidate(path) or (also is not None and also.wants(path))

    unreadable: list[dict[str, str]] = []
    seen = 0

    def sifts(path: str) -> bool:
        # a library no other reader of the pass wants whole may come as the cubin scan's summary
        return is_device_code_candidate(path) and not collector.wants(path) and not (also is not None and also.wants(path))

    def device_code() -> Iterator[artifacts.Member]:
        # the inventory takes its small files on the way; the cubin parser gets the
        # candidates straight from the reader (a spooled one stays a mapping of the
        # reader's file): no copy to a scratch directory, no second read
        nonlocal seen
        for member in _members(target, want, progress, HostLibrarySieve(sifts)):
            seen += 1
            if member.data is None:
                if member.summary is None:
                    unreadable.append({"path": member.path, "error": member.error})
                else:
                    yield member  # sifted: the cubin scan's own answer, and nobody else wanted it
                continue
            if collector.wants(member.path):
                collector.add(member.path, member.data)
            if also is not None and also.wants(member.path):
                also.add(member.path, member.data)
            if is_device_code_candidate(member.path):
                yield member

    report = scan_members(device_code(), gpu, required, target=target, kernels=kernels)
    doc = report.to_json()
    libraries = [{k: lib[k] for k in GPU_LIBRARY_KEYS if k in lib} for lib in doc.get("libraries", [])]
    libraries.sort(key=lambda d: d["path"])
    return Gathered(
        target=target, kind=kind, digest=digest, inventory=collector.finish(), libraries=libraries,
        unreadable=unreadable + list(doc.get("unreadable", [])), files_seen=seen, cubins=report,
    )  # fmt: skip


def run_audit(commit: str | None, repo: Path | None) -> dict[str, Any]:
    """The fix audit of the image's vLLM commit, or `skipped` with the reason."""
    if not commit:
        return {"status": "skipped", "reason": "no vLLM commit recorded in vllm/_version.py"}
    from spark_images import audit

    try:
        report = audit.check_required(commit, (), repo=repo)
    except SparkImagesError as exc:
        return {"status": "skipped", "reason": exc.message}
    return audit_doc(report)


def audit_doc(report: AuditReport) -> dict[str, Any]:
    """An audit report as the `fixes` of a check (also the build line's own audit, reused)."""
    failing = [f.to_json() for f in report.fixes if f.failing]
    return {
        "status": "failed" if failing else "passed",
        "commit": report.commit,
        "included": report.included_prs(),
        "failing": failing,
        "fixes": [f.to_json() for f in report.fixes],
        "notes": list(report.notes),
    }
