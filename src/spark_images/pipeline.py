"""The build line: validate -> audit -> render -> build -> cubins -> coherence -> lock.

Each stage adds its section to one BuildRecord; the first failed gate stops
the line (exit 1, the record says which stage and why). An environment that
cannot run a stage the line needs (no engine, no buildx, no arm64 emulation)
stops it with exit 2. The record (`build/NAME/record.json`) and the Markdown
report are written atomically at the end of every run that was not
interrupted and got past validate (or was given --build-dir: before validate
the profile's name is not known); the lock (`images.lock.json`) only when
every gate passed.

Which skipped stages still allow the lock (a gate that did not run is not a
pass, and the lock says which ones did not run):
- coherence skipped (no sm_121 GPU here): allowed, recorded with its reason;
  proving coherence is the Spark runner's job before publish moves a tag.
- audit skipped (no vLLM history) while the profile requires no fix: allowed,
  recorded with its reason; `fixes_included` then lists only the PRs the
  plan's patches backport (known without history).
- audit skipped while the profile requires fixes: NOT allowed. The line still
  builds and inspects the image (so the record is useful), but the lock is
  not written and the exit code is 1: the required fixes are unproven.

SOURCE_DATE_EPOCH (every timestamp in the image, and the lock's `created`):
1. SOURCE_DATE_EPOCH in the environment (the reproducible-builds convention:
   the caller decides, e.g. to reproduce a published image);
2. the profile's pin, when the plan carries `source_date_epoch`;
3. the vLLM commit's committer time from the audit's git history;
otherwise the build stops (exit 2) naming these three ways. A digest must
not depend on which host happened to have the history, so a pin wins over it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spark_images import atomic, lock, summary
from spark_images.errors import EXIT_FINDING, EXIT_USAGE, EnvironmentProblem, SparkImagesError
from spark_images.record import BuildRecord, stage

Log = Callable[[str], None]
LOCAL_REPOSITORY = "spark-images/{name}"
LOCAL_TAG = "build"
CA_SECRET_ID = "cacert"
NO_SPARK_CODE = ("missing", "no-gpu-code", "jit-only")


@dataclass(frozen=True)
class BuildOptions:
    profile: Path
    push: str | None = None
    cache: str | None = None
    ca_cert: Path | None = None
    dry_run: bool = False
    lock_path: Path = Path(lock.DEFAULT_LOCK)
    build_dir: Path | None = None
    vllm_repo: Path | None = None
    no_cache: bool = False
    keep_oci: bool = False


@dataclass
class Outcome:
    record: BuildRecord
    exit_code: int
    record_path: Path | None = None
    report_path: Path | None = None
    lock_written: bool = False
    timings: dict[str, float] = field(default_factory=dict)


class StageStop(Exception):
    """A stage ended the line: its section is already in the record."""

    def __init__(self, exit_code: int) -> None:
        super().__init__(exit_code)
        self.exit_code = exit_code


# -- helpers that adapt the other rooms' reports ------------------------------
def _jsonable(report: Any) -> dict[str, Any]:
    if hasattr(report, "to_json"):
        doc = report.to_json()
        return doc if isinstance(doc, dict) else {"report": doc}
    return dict(report) if isinstance(report, dict) else {"report": str(report)}


def _ints(values: Any) -> list[int]:
    out: list[int] = []
    for value in values or ():
        with contextlib.suppress(TypeError, ValueError):
            out.append(int(getattr(value, "pr", value)))
    return sorted(set(out))


def patch_prs(plan_doc: dict[str, Any]) -> list[int]:
    return _ints(pr for patch in plan_doc.get("patches", ()) for pr in patch.get("prs", ()))


def source_date_epoch(env: dict[str, str], pinned: int | None, commit_time: int | None) -> tuple[int, str]:
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
        "or set SOURCE_DATE_EPOCH to the vLLM commit's time)"
    )


def vllm_commit_time(audit_mod: Any, commit: str, repo: Path | None) -> int | None:
    """The committer time of the vLLM commit, through the audit room's git plumbing.

    Called only after the audit ran, so the history is at hand (a treeless
    clone holds every commit object); None when it cannot be read.
    """
    try:
        history = audit_mod.open_history(repo)
        out = history.repo.git("show", "-s", "--format=%ct", commit)
        return int(out.decode().strip().splitlines()[-1])
    except (SparkImagesError, ValueError, IndexError, AttributeError, OSError):
        return None


def _problem_lines(exc: SparkImagesError) -> str:
    return "; ".join(line.removeprefix(": ") for line in exc.lines())


# -- the line ------------------------------------------------------------------
class Line:
    def __init__(self, opts: BuildOptions, log: Log) -> None:
        self.opts = opts
        self.log = log
        self.record = BuildRecord(profile=opts.profile.stem)
        self.timings: dict[str, float] = {}
        self.plan: Any = None
        self.profile: Any = None
        self.root: Path = opts.profile.resolve().parent.parent
        self.plan_doc: dict[str, Any] = {}
        self.commit_time: int | None = None
        self.fixes_included: list[int] = []
        self.audit_blocks_lock = ""

    # stage runner: records failures uniformly, stops the line
    def _fail(self, name: str, status: str, reason: str, code: int, **details: Any) -> StageStop:
        self.record.set(name, stage(status, reason, **details))  # type: ignore[arg-type]
        self.log(f"[{name}] {status}: {reason}")
        return StageStop(code)

    def _fail_on(self, name: str, exc: SparkImagesError, **details: Any) -> StageStop:
        """`_fail` for an error another room raised: its exit code decides failed (1) or error (2)."""
        status = "failed" if exc.exit_code == EXIT_FINDING else "error"
        return self._fail(name, status, _problem_lines(exc), exc.exit_code, **details)

    @property
    def build_dir(self) -> Path:
        name = self.plan.profile_name if self.plan is not None else self.opts.profile.stem
        return self.opts.build_dir or (self.root / "build" / name)

    def validate(self) -> None:
        from spark_images import resolve

        started = time.monotonic()
        try:
            resolved = resolve.resolve_profile(self.opts.profile)
        except SparkImagesError as exc:
            raise self._fail_on("validate", exc, problems=exc.lines()) from exc
        self.plan, self.profile, self.root = resolved.plan, resolved.profile, resolved.base_dir
        self.plan_doc = self.plan.to_json()
        self.record.profile = self.plan.profile_name
        # an unusable requirements lock (missing, incomplete, unhashed) was
        # already refused by resolve_profile, as `validate` refuses it
        warnings = [w.line() for w in resolved.warnings]
        for line in warnings:
            self.log(f"[validate] {line}")
        self.record.set("validate", stage("passed", plan=self.plan_doc, warnings=warnings))
        self.timings["validate"] = time.monotonic() - started

    def preflight(self) -> None:
        """Engine, buildx and arm64 emulation, checked before the slow stages (exit 2)."""
        from spark_images.engine import build as engine_build

        try:
            engine_build.require_buildx()
            engine_build.emulation()
        except EnvironmentProblem as exc:
            raise self._fail_on("build", exc) from exc

    def audit(self) -> None:
        required = list(self.plan.required_fixes)
        from_patches = patch_prs(self.plan_doc)
        try:
            from spark_images import audit as audit_mod

            check = audit_mod.check_required
        except (ImportError, AttributeError) as exc:
            self._audit_skipped(f"the audit is not installed here ({exc})", required, from_patches)
            return
        try:
            patch_files = [self.root / patch.path for patch in self.plan.patches]
            report = check(self.plan.vllm_commit, tuple(required), patch_files, self.opts.vllm_repo)
        except EnvironmentProblem as exc:
            self._audit_skipped(_problem_lines(exc), required, from_patches)
            return
        except SparkImagesError as exc:
            raise self._fail_on("audit", exc) from exc
        doc = _jsonable(report)
        missing = _ints(doc.get("missing_required", ()))
        included = _ints(doc.get("included", ()))
        commit_time = getattr(report, "commit_time", doc.get("commit_time"))
        if not isinstance(commit_time, int | float):
            commit_time = vllm_commit_time(audit_mod, self.plan.vllm_commit, self.opts.vllm_repo)
        self.commit_time = int(commit_time) if commit_time is not None else None
        self.fixes_included = sorted(set(included) | set(from_patches))
        if missing:
            raise self._fail(
                "audit", "failed",
                f"required fixes missing from vLLM {self.plan.vllm_commit[:12]}: "
                + ", ".join(f"#{n}" for n in missing),
                EXIT_FINDING, required=required, missing=missing, report=doc,
            )  # fmt: skip
        self.record.set(
            "audit", stage("passed", required=required, fixes_included=self.fixes_included, report=doc)
        )

    def _audit_skipped(self, why: str, required: list[int], from_patches: list[int]) -> None:
        self.fixes_included = from_patches
        reason = f"not run: {why}"
        if required:
            self.audit_blocks_lock = (
                f"the profile requires fixes {', '.join(f'#{n}' for n in required)} and the audit did not run"
            )
        self.record.set(
            "audit",
            stage("skipped", reason, required=required, fixes_included=from_patches,
                  fixes_included_source="plan patches only (no history)"),
        )  # fmt: skip
        self.log(f"[audit] skipped: {why}")

    def render(self) -> tuple[Path, Path]:
        from spark_images import render as render_mod

        started = time.monotonic()
        context = self.build_dir / "context"
        try:
            dockerfile, _plan_json = render_mod.write_render(self.plan, context, self.root)
        except SparkImagesError as exc:
            raise self._fail_on("render", exc) from exc
        self.timings["render"] = time.monotonic() - started
        self.record.set("render", stage("passed", dockerfile=str(dockerfile), context=str(context)))
        return context, dockerfile

    def build_request(
        self, context: Path, dockerfile: Path, work: Path, no_cache: bool
    ) -> tuple[Any, dict[str, Any]]:
        """The engine request of this plan and the record fields that describe it.

        Everything that reaches the image (build args, labels via the plan,
        SOURCE_DATE_EPOCH) is decided here, once, for `build` and `verify-repro`.
        """
        from spark_images.engine import build as engine_build

        epoch, epoch_source = source_date_epoch(
            dict(os.environ), self.plan.source_date_epoch, self.commit_time
        )
        secrets: tuple[engine_build.Secret, ...] = ()
        if self.opts.ca_cert is not None:
            secrets = (engine_build.Secret(CA_SECRET_ID, self.opts.ca_cert.resolve()),)
        cache_from: tuple[str, ...] = ()
        cache_to = None
        if self.opts.cache:
            where = self.opts.cache
            spec_from, cache_to = engine_build.cache_specs(where, Path(where).exists())
            # a local cache directory that does not exist yet has nothing to import
            if not (spec_from.startswith("type=local") and not Path(where).joinpath("index.json").exists()):
                cache_from = (spec_from,)
        local_name = LOCAL_REPOSITORY.format(name=self.plan.profile_name)
        build_args = {
            "IMAGE_CREATED": lock.rfc3339(epoch),
            "FIXES_INCLUDED": ",".join(str(n) for n in self.fixes_included),
        }
        request = engine_build.BuildRequest(
            context=context,
            dockerfile=dockerfile,
            oci_dest=work / "image.oci.tar",
            metadata_file=work / "metadata.json",
            image_name=f"{local_name}:{LOCAL_TAG}",
            source_date_epoch=epoch,
            build_args=build_args,
            secrets=secrets,
            cache_from=cache_from,
            cache_to=cache_to,
            no_cache=no_cache,
        )
        section: dict[str, Any] = {
            "source_date_epoch": epoch,
            "source_date_epoch_from": epoch_source,
            "created": lock.rfc3339(epoch),
            "platform": request.platform,
            "ca_cert": str(self.opts.ca_cert) if self.opts.ca_cert else None,
            "cache": self.opts.cache,
        }
        return request, section

    def build(self, context: Path, dockerfile: Path) -> dict[str, Any]:
        from spark_images.engine import build as engine_build
        from spark_images.registry import push as registry_push

        started = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix=".oci-", dir=self.build_dir))
        try:
            request, section = self.build_request(context, dockerfile, work, self.opts.no_cache)
            target, push_tags = (
                registry_push.parse_push_target(self.opts.push) if self.opts.push else (None, ())
            )
        except SparkImagesError as exc:
            shutil.rmtree(work, ignore_errors=True)
            raise self._fail_on("build", exc) from exc
        local_name = LOCAL_REPOSITORY.format(name=self.plan.profile_name)
        try:
            try:
                result = engine_build.build(request, on_log=self.log)
            except SparkImagesError as exc:  # BuildFailed (1) or the environment (2)
                raise self._fail_on("build", exc, **section) from exc
            section.update(
                digest=result.digest,
                config_digest=result.config_digest,
                emulated=result.emulated,
                build_seconds=round(result.seconds, 3),
            )
            self.timings["buildx"] = result.seconds
            try:
                t0 = time.monotonic()
                local_ref = engine_build.load_oci(result.oci_archive, request.image_name, result.digest)
                self.timings["load"] = time.monotonic() - t0
                section["local_image"] = local_ref
                repository = local_name
                if target is not None:
                    t0 = time.monotonic()
                    pushed = registry_push.push_oci_archive(
                        result.oci_archive, target, push_tags, digest=result.digest, on_progress=self.log
                    )
                    answered = registry_push.registry_digest(target, pushed.digest)
                    self.timings["push"] = time.monotonic() - t0
                    if answered != result.digest:
                        raise self._fail(
                            "build", "failed",
                            f"registry {target} holds {answered}, not the built digest {result.digest}",
                            EXIT_FINDING, **section,
                        )  # fmt: skip
                    repository = str(target)
                    section.update(pushed=True, registry_digest=answered, tags=list(pushed.tags))
                else:
                    section["pushed"] = False
            except SparkImagesError as exc:  # load or push: the engine, the registry, the archive
                raise self._fail_on("build", exc, **section) from exc
            if self.opts.keep_oci:
                kept = self.build_dir / "image.oci.tar"
                os.replace(result.oci_archive, kept)
                section["oci_archive"] = str(kept)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        section.update(repository=repository, image=f"{repository}@{result.digest}")
        section["seconds"] = round(time.monotonic() - started, 3)
        self.record.set("build", stage("passed", **section))
        return section

    def cubins(self, built: dict[str, Any]) -> dict[str, Any]:
        started = time.monotonic()
        target = built["image"] if built.get("pushed") else f"docker://{built['local_image']}"
        globs = tuple(self.plan.native_libraries)
        reused = self._previous_cubins(built["digest"], globs)
        if reused is not None:
            self.record.set("cubins", reused)
            self.timings["cubins"] = time.monotonic() - started
            return reused
        try:
            from spark_images import cubins as cubins_mod

            report = cubins_mod.scan_target(target, gpu="sm_121", required=globs)
        except SparkImagesError as exc:
            raise self._fail_on("cubins", exc, target=target) from exc
        # the inspector's own gate: every required library carries code that
        # runs natively on sm_121 (a "partial" image-wide verdict is expected:
        # torch and friends ship code for other GPUs too)
        section = cubins_mod.record_section(report)
        section["required"] = list(globs)
        self.timings["cubins"] = time.monotonic() - started
        if section.get("status") != "passed" or section.get("verdict") in NO_SPARK_CODE:
            reason = section.get("reason") or f"verdict {section.get('verdict')}: no sm_121 code at all"
            section = {**section, "status": "failed", "reason": reason}
            self.record.set("cubins", section)
            self.log(f"[cubins] failed: {reason}")
            raise StageStop(EXIT_FINDING)
        self.record.set("cubins", section)
        return section

    def _previous_cubins(self, digest: str, globs: tuple[str, ...]) -> dict[str, Any] | None:
        """The passed cubins section of the last record of this same digest, if any.

        A digest names the image's bytes, so a no-change rebuild need not scan
        them again; the section says where it came from.
        """
        path = self.build_dir / "record.json"
        try:
            old = BuildRecord.load(path).to_json()
        except (OSError, SparkImagesError):
            return None
        section = old.get("cubins")
        if (
            not isinstance(section, dict)
            or section.get("status") != "passed"
            or old.get("build", {}).get("digest") != digest
            or tuple(section.get("required", ())) != globs
        ):
            return None
        return {**section, "reused_from": f"{path} (same digest {digest})"}

    def coherence(self, built: dict[str, Any]) -> dict[str, Any]:
        from spark_images import coherence as coherence_mod

        settings = self.profile.verify.coherence
        image_ref = built["image"] if built.get("pushed") else built["local_image"]
        if settings is None or not settings.models:
            section = stage("skipped", "the profile names no verify.coherence models", image=image_ref)
            self.record.set("coherence", section)
            return section
        kwargs: dict[str, Any] = {"kv_cache_dtypes": settings.kv_cache_dtypes or ("auto",)}
        if settings.moe_backends:
            kwargs["moe_backends"] = settings.moe_backends
        if settings.linear_backends:
            kwargs["linear_backends"] = settings.linear_backends
        try:
            section = dict(
                coherence_mod.gate_image(
                    image_ref, settings.models, serve_args=self.plan.serve_args,
                    progress=lambda line: self.log(f"[coherence] {line}"), **kwargs,
                )
            )  # fmt: skip
        except SparkImagesError as exc:
            raise self._fail_on("coherence", exc) from exc
        self.record.set("coherence", section)
        if section.get("status") not in ("passed", "skipped"):
            self.log(f"[coherence] {section.get('status')}: {section.get('reason', '')}")
            raise StageStop(EXIT_FINDING)
        if section.get("status") == "skipped":
            self.log(f"[coherence] skipped: {section.get('reason', '')}")
        return section

    def write_lock(self, built: dict[str, Any], cubins: dict[str, Any], coherence: dict[str, Any]) -> bool:
        if self.audit_blocks_lock:
            self.record.set("lock", stage("skipped", f"not written: {self.audit_blocks_lock}"))
            return False
        try:
            previous = lock.load_lock(self.opts.lock_path)["images"].get(self.plan.profile_name, {})
        except SparkImagesError as exc:
            raise self._fail_on("lock", exc) from exc
        tags = previous.get("tags", []) if previous.get("digest") == built["digest"] else []
        entry = lock.make_entry(
            profile_path=self.plan.profile_path,
            repository=built["repository"],
            digest=built["digest"],
            plan=self.plan_doc,
            fixes_included=self.fixes_included,
            audit=self.record.sections.get("audit", {}),
            cubins=cubins,
            coherence=coherence,
            source_date_epoch=built["source_date_epoch"],
            tags=tags,
        )
        try:
            lock.update_entry(self.opts.lock_path, self.plan.profile_name, entry)
        except SparkImagesError as exc:  # the lock went bad or unreadable since it was read above
            raise self._fail_on("lock", exc) from exc
        except OSError as exc:  # atomic: the old lock stays whole
            raise self._fail(
                "lock", "error", f"{self.opts.lock_path}: cannot write ({exc.strerror or exc})", EXIT_USAGE
            ) from exc
        self.record.set("lock", stage("passed", path=str(self.opts.lock_path), image=entry["image"]))
        return True

    def _timed(self, name: str, fn: Callable[[], Any]) -> Any:
        started = time.monotonic()
        try:
            return fn()
        finally:
            self.timings[name] = time.monotonic() - started

    def run(self) -> Outcome:
        code = 0
        written = False
        try:
            self.validate()
            self.build_dir.mkdir(parents=True, exist_ok=True)
            if not self.opts.dry_run:
                self._timed("preflight", self.preflight)
            self._timed("audit", self.audit)
            context, dockerfile = self.render()
            if self.opts.dry_run:
                for name in ("build", "cubins", "coherence", "lock"):
                    self.record.set(name, stage("skipped", "dry run"))
            else:
                built = self._timed("build", lambda: self.build(context, dockerfile))
                cubins = self.cubins(built)
                coherence = self._timed("coherence", lambda: self.coherence(built))
                written = self._timed("lock", lambda: self.write_lock(built, cubins, coherence))
                if not written:
                    code = EXIT_FINDING
        except StageStop as stop:
            code = stop.exit_code
        result: dict[str, Any] = {"status": "passed" if code == 0 else "failed", "exit_code": code}
        failed = [n for n, s in self.record.sections.items() if isinstance(s, dict) and s.get("status") in ("failed", "error")]
        if failed:
            result["reason"] = f"stage {failed[0]}: {self.record.sections[failed[0]].get('reason', '')}"
        elif code:
            result["reason"] = self.record.sections.get("lock", {}).get("reason", "")
        result["timings"] = {k: round(v, 3) for k, v in self.timings.items()}
        self.record.set("result", result)
        out = Outcome(self.record, code, lock_written=written, timings=self.timings)
        if self.plan is not None or self.opts.build_dir is not None:
            out.record_path = self.record.save(self.build_dir / "record.json")
            out.report_path = atomic.write_text(self.build_dir / "report.md", summary.markdown(self.record.to_json()))
        return out


def run_build(opts: BuildOptions, log: Log) -> Outcome:
    return Line(opts, log).run()


@dataclass
class ReproOutcome:
    doc: dict[str, Any]
    exit_code: int


def verify_repro(opts: BuildOptions, log: Log) -> ReproOutcome:
    """Build the plan twice without cache; same manifest digest or the files that differ.

    Validate, audit and render run as in `build` (the audit decides the
    SOURCE_DATE_EPOCH and the fixes label, both of which reach the image).
    Nothing is pushed, loaded or locked.
    """
    from spark_images import repro
    from spark_images.engine import build as engine_build

    line = Line(opts, log)
    try:
        line.validate()
        line.build_dir.mkdir(parents=True, exist_ok=True)
        line.audit()
        context, dockerfile = line.render()
    except StageStop as stop:
        return ReproOutcome({"profile": line.record.profile, "stages": line.record.to_json()}, stop.exit_code)
    work = Path(tempfile.mkdtemp(prefix=".repro-", dir=line.build_dir))
    try:
        digests: list[str] = []
        archives: list[Path] = []
        seconds: list[float] = []
        for n in (1, 2):
            log(f"[verify-repro] build {n} of 2 (no cache)")
            request, section = line.build_request(context, dockerfile, work / f"build{n}", no_cache=True)
            try:
                result = engine_build.build(request, on_log=log)
            except engine_build.BuildFailed as exc:
                doc = {"profile": line.plan.profile_name, "status": "failed", "reason": f"build {n}: {exc}"}
                return ReproOutcome(doc, EXIT_FINDING)
            digests.append(result.digest)
            archives.append(result.oci_archive)
            seconds.append(round(result.seconds, 3))
        same = digests[0] == digests[1]
        doc: dict[str, Any] = {
            "profile": line.plan.profile_name,
            "reproducible": same,
            "digests": digests,
            "build_seconds": seconds,
            "source_date_epoch": section["source_date_epoch"],
            "source_date_epoch_from": section["source_date_epoch_from"],
            "audit": {k: v for k, v in line.record.sections.get("audit", {}).items() if k in ("status", "reason")},
        }
        if not same:
            doc["differences"] = repro.differences(repro.listing(archives[0]), repro.listing(archives[1]))
        return ReproOutcome(doc, 0 if same else EXIT_FINDING)
    finally:
        shutil.rmtree(work, ignore_errors=True)
