"""The stages of the build line, each one function: inputs in, a frozen result out.

The I/O of the line lives here (resolve, git through the audit, render, the
engine, the registry, the cubin inspector, the coherence runner); what each
result means for the line is decided in `gates`. Another room's error becomes
a `StageError` naming the stage; its exit code says finding (1) or
environment (2).

SOURCE_DATE_EPOCH (every timestamp in the image, and the lock's `created`):
1. SOURCE_DATE_EPOCH in the environment (the reproducible-builds convention:
   the caller decides, e.g. to reproduce a published image);
2. the profile's pin, when the plan carries `source_date_epoch`;
3. the vLLM commit's committer time from the audit's git history;
otherwise the build stops (exit 2) naming these three ways. A digest must
not depend on which host happened to have the history, so a pin wins over it.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from spark_images import defaults
from spark_images.buildline.stages import (
    FAILED,
    PASSED,
    SKIPPED,
    Audited,
    Built,
    Gated,
    Rendered,
    ScanKey,
    Scanned,
    StageError,
    Validated,
)
from spark_images.coherence.checks import GateOptions
from spark_images.core.errors import EnvironmentProblem, SparkImagesError
from spark_images.engine import build as engine_build
from spark_images.readers.images import ImageArchive
from spark_images.registry import push as registry_push
from spark_images.registry.reference import ImageReference
from spark_images.release import lock

Log = Callable[[str], None]
LOCAL_REPOSITORY = "spark-images/{name}"
LOCAL_TAG = "build"
CA_SECRET_ID = "cacert"


def source_date_epoch(env: Mapping[str, str], pinned: int | None, commit_time: int | None) -> tuple[int, str]:
    """(epoch, where it came from) per the order in the module docstring (pure)."""
    raw = env.get("SOURCE_DATE_EPOCH", "").strip()
    if raw:
        if not re.fullmatch(r"\d{1,12}", raw):
            raise EnvironmentProblem(f"SOURCE_DATE_EPOCH={raw!r} is not a number of seconds (unset it or fix it)")
        return int(raw), "environment SOURCE_DATE_EPOCH"
    if pinned is not None:
        return int(pinned), "profile pin"
    if commit_time is not None:
        return int(commit_time), "vLLM commit time (git history)"
    raise EnvironmentProblem(
        "no SOURCE_DATE_EPOCH for a reproducible build: the vLLM history is unavailable and the profile "
        "pins none (fix: make the history available to the audit, e.g. --vllm-repo PATH, "
        "set build.source_date_epoch in the profile, or set SOURCE_DATE_EPOCH to the vLLM commit's time)"
    )


def vllm_commit_time(audit_mod: ModuleType, commit: str, repo: Path | None) -> int | None:
    """The committer time of the vLLM commit, through the audit room's git plumbing.

    For an audit report that did not carry it; None when it cannot be read.
    """
    try:
        history = audit_mod.open_history(repo)
        out = history.repo.git("show", "-s", "--format=%ct", commit)
        return int(out.decode().strip().splitlines()[-1])
    except (SparkImagesError, ValueError, IndexError, OSError):
        return None


def validate(profile: Path, log: Log) -> Validated:
    from spark_images.buildline import resolve

    try:
        resolved = resolve.resolve_profile(profile)
    except SparkImagesError as exc:
        raise StageError.of("validate", exc, problems=exc.lines()) from exc
    # an unusable requirements lock (missing, incomplete, unhashed) was
    # already refused by resolve_profile, as `validate` refuses it
    warnings = tuple(w.line() for w in resolved.warnings)
    for line in warnings:
        log(f"[validate] {line}")
    return Validated(plan=resolved.plan, base_dir=resolved.base_dir, warnings=warnings, recipes=resolved.recipes)


def audit(v: Validated, vllm_repo: Path | None, log: Log) -> Audited:
    """The required fixes checked on the vLLM history; skipped (not failed) without history."""
    from spark_images import audit as audit_mod

    plan = v.plan
    required = tuple(plan.required_fixes)
    from_patches = tuple(sorted({pr for patch in plan.patches for pr in patch.prs}))
    try:
        # the plan's own PatchRefs: the PRs its headers declare were parsed once, when planning
        report = audit_mod.check_required(plan.vllm_commit, required, plan.patches, vllm_repo,
                                          strategy=plan.strategy, base_dir=v.base_dir)
    except EnvironmentProblem as exc:
        why = "; ".join(line.removeprefix(": ") for line in exc.lines())
        log(f"[audit] skipped: {why}")
        return Audited(SKIPPED, required, from_patches, reason=why)
    except SparkImagesError as exc:
        raise StageError.of("audit", exc) from exc
    commit_time = report.commit_time
    if commit_time is None:
        commit_time = vllm_commit_time(audit_mod, plan.vllm_commit, vllm_repo)
    status = FAILED if report.missing_required else PASSED
    return Audited(status, required, from_patches, report=report, commit_time=commit_time)


def render(v: Validated, build_dir: Path) -> Rendered:
    from spark_images.buildline import render as render_mod

    context = build_dir / "context"
    try:
        dockerfile, _plan_json = render_mod.write_render(v.plan, context, v.base_dir)
    except SparkImagesError as exc:
        raise StageError.of("render", exc) from exc
    return Rendered(context=context, dockerfile=dockerfile)


def build_request(
    v: Validated, a: Audited, r: Rendered, work: Path, *, ca_cert: Path | None, cache: str | None, no_cache: bool
) -> tuple[engine_build.BuildRequest, str]:
    """The engine request of this plan and where its SOURCE_DATE_EPOCH came from.

    Everything that reaches the image is decided here, once, for `build` and
    `verify-repro`: the plan (its labels included) and SOURCE_DATE_EPOCH. Not
    what the audit found: that would make the digest depend on the host.
    """
    epoch, epoch_from = source_date_epoch(
        {defaults.Env.SOURCE_DATE_EPOCH: defaults.source_date_epoch() or ""}, v.plan.source_date_epoch, a.commit_time
    )
    secrets: tuple[engine_build.Secret, ...] = ()
    if ca_cert is not None:
        secrets = (engine_build.Secret(CA_SECRET_ID, ca_cert.resolve()),)
    cache_from: tuple[str, ...] = ()
    cache_to = None
    if cache:
        spec_from, cache_to = engine_build.cache_specs(cache, Path(cache).exists())
        # a local cache directory that does not exist yet has nothing to import
        if not (spec_from.startswith("type=local") and not Path(cache).joinpath("index.json").exists()):
            cache_from = (spec_from,)
    request = engine_build.BuildRequest(
        context=r.context,
        dockerfile=r.dockerfile,
        oci_dest=work / "image.oci.tar",
        metadata_file=work / "metadata.json",
        image_name=f"{LOCAL_REPOSITORY.format(name=v.plan.profile_name)}:{LOCAL_TAG}",
        source_date_epoch=epoch,
        build_args={"IMAGE_CREATED": lock.rfc3339(epoch)},
        secrets=secrets,
        cache_from=cache_from,
        cache_to=cache_to,
        no_cache=no_cache,
    )
    return request, epoch_from


def build(
    v: Validated, a: Audited, r: Rendered, work: Path, *,
    push: ImageReference | None, ca_cert: Path | None, cache: str | None, no_cache: bool,
    log: Log, timings: dict[str, float],
) -> Built:  # fmt: skip
    """Build, load into the engine, and push by digest only (tags move only in `publish`)."""
    started = time.monotonic()
    details: dict[str, object] = {"ca_cert": str(ca_cert) if ca_cert else None, "cache": cache}
    try:
        request, epoch_from = build_request(v, a, r, work, ca_cert=ca_cert, cache=cache, no_cache=no_cache)
    except SparkImagesError as exc:
        raise StageError.of("build", exc, **details) from exc
    details.update(source_date_epoch=request.source_date_epoch, source_date_epoch_from=epoch_from,
                   created=lock.rfc3339(request.source_date_epoch), platform=request.platform)  # fmt: skip
    try:
        result = engine_build.build(request, on_log=log)
    except SparkImagesError as exc:  # BuildFailed (1) or the environment (2)
        raise StageError.of("build", exc, **details) from exc
    details.update(digest=result.digest, config_digest=result.config_digest, emulated=result.emulated)
    timings["buildx"] = result.seconds
    repository = LOCAL_REPOSITORY.format(name=v.plan.profile_name)
    registry_digest = None
    try:
        t0 = time.monotonic()
        local_ref = engine_build.load_oci(result.oci_archive, request.image_name, result.digest)
        timings["load"] = time.monotonic() - t0
        if push is not None:
            t0 = time.monotonic()
            pushed = registry_push.push_oci_archive(ImageArchive(result.oci_archive), push, (), digest=result.digest, on_progress=log)
            registry_digest = registry_push.registry_digest(push, pushed.digest)
            timings["push"] = time.monotonic() - t0
            if registry_digest != result.digest:
                raise StageError(
                    "build", f"registry {push} holds {registry_digest}, not the built digest {result.digest}",
                    1, **details,
                )  # fmt: skip
            repository = str(push)
    except SparkImagesError as exc:  # load or push: the engine, the registry, the archive
        raise StageError.of("build", exc, **details) from exc
    return Built(
        repository=repository,
        digest=result.digest,
        config_digest=result.config_digest,
        oci_archive=result.oci_archive,
        local_image=local_ref,
        source_date_epoch=request.source_date_epoch,
        source_date_epoch_from=epoch_from,
        platform=request.platform,
        emulated=result.emulated,
        build_seconds=result.seconds,
        pushed=push is not None,
        registry_digest=registry_digest,
        ca_cert=str(ca_cert) if ca_cert else None,
        cache=cache,
        seconds=time.monotonic() - started,
    )


def coherence(
    v: Validated, b: Built, log: Log, *, gpus: str | None = "all", assume_gpu: bool = False,
    options: GateOptions | None = None,
) -> Gated:
    """The Spark gate on the built image: the profile's backend matrix, then each recipe
    it lists served with its exact command; skipped (never passed) without an sm_121 GPU.

    `gpus`, `assume_gpu` and `options` are the gate's own knobs, for a stand-in server in
    tests (`assume_gpu` is recorded in the section, and publish refuses such a record).
    The profile's `verify.coherence.rounds` (the plan's, kept out of the image's plan.json)
    is how often each combination is served, whatever `options` says, as `coherence --profile`
    serves it.
    """
    from spark_images import coherence as coherence_mod
    from spark_images.recipes import gate as recipe_rules
    from spark_images.recipes import serving as recipe_gate

    settings = v.plan.coherence  # the plan's matrix, defaults applied: no Profile after planning
    image_ref = b.runnable
    if settings is None or not settings.models:
        reason = "the profile names no verify.coherence models"
        return Gated(SKIPPED, reason, {"status": SKIPPED, "reason": reason, "image": image_ref})
    kwargs: dict[str, object] = {"kv_cache_dtypes": settings.kv_cache_dtypes or ("auto",)}
    if settings.moe_backends:
        kwargs["moe_backends"] = settings.moe_backends
    if settings.linear_backends:
        kwargs["linear_backends"] = settings.linear_backends
    progress = lambda line: log(f"[coherence] {line}")  # noqa: E731
    try:
        opts = dataclasses.replace(options or GateOptions(), rounds=settings.rounds)
        section = dict(
            coherence_mod.gate_image(
                image_ref, settings.models, serve_args=v.plan.serve_args, gpus=gpus, assume_gpu=assume_gpu,
                options=opts, progress=progress, **kwargs,  # type: ignore[arg-type]
            )
        )  # fmt: skip
        runs: list[dict[str, Any]] = []
        if v.recipes:
            runs = recipe_gate.gate_recipes(image_ref, v.recipes, digest=b.digest, gpus=gpus,
                                            assume_gpu=assume_gpu, options=options, progress=progress)  # fmt: skip
            section = recipe_rules.with_recipes(section, runs)
    except SparkImagesError as exc:
        raise StageError.of("coherence", exc) from exc
    status = str(section.get("status"))
    reason = str(section.get("reason", ""))
    if status != PASSED:
        log(f"[coherence] {status}: {reason}")
    return Gated(status, reason, section, tuple(recipe_rules.RecipeRun.of(run) for run in runs))


GPU = defaults.GPU


def scan_target_of(b: Built) -> str:
    """What the cubin inspector reads for the built image: the OCI archive buildx wrote.

    It holds the very bytes of the digest, so nothing is downloaded back from
    the registry and nothing is `docker save`d (artifacts reads its layers).
    """
    return str(b.oci_archive)


def audit_fixes(a: Audited | None) -> dict[str, Any]:
    """The build's own audit as the check's `fixes`: the vLLM history is not read twice."""
    from spark_images.check import audit_doc

    if a is None or a.report is None:
        why = a.reason if a is not None else "the audit did not run"
        return {"status": SKIPPED, "reason": f"not run: {why}"}
    return audit_doc(a.report)


def scan(v: Validated, b: Built, build_dir: Path, a: Audited | None = None) -> Scanned:
    """`check` of the built OCI archive; the same read gives the cubin gate's report.

    No earlier verdict is reused: `check` reads the archive anyway, and its
    pass classifies the device code on the way.
    """
    from spark_images import __version__
    from spark_images import check as check_mod

    key = ScanKey(b.digest, __version__, GPU, tuple(v.plan.native_libraries))
    target = scan_target_of(b)
    try:
        found = check_mod.gather(target, GPU, required=key.globs)
    except SparkImagesError as exc:
        raise StageError.of("cubins", exc, target=target) from exc
    report = found.cubins
    assert report is not None  # gather always scans
    result = check_mod.judge_gathered(found, GPU, audit_fixes(a))
    return Scanned(
        key=key, target=target, verdict=report.verdict, missing_required=tuple(report.missing_required),
        report=report, check=result,
    )  # fmt: skip
