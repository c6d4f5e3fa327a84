"""The build line: validate -> audit -> render -> build -> cubins (+ check) -> coherence -> lock.

Each stage (`steps`) returns a frozen result (`stages`); `gates` decides from
those whether the line goes on and whether the lock may be written. The first
failed gate stops the line (exit 1, the record says which stage and why). An
environment that cannot run a stage the line needs (no engine, no buildx, no
arm64 emulation, a registry or index out of reach) stops it with exit 2.

At the end of every run that was not interrupted and got past validate (or
was given --build-dir: before validate the profile's name is not known) the
results are serialised (`serialise`), atomically: the record
(`build/NAME/record.json`), the Markdown report and the audit predicate
(`build/NAME/audit-predicate.json`). The lock (`images.lock.json`) gets a
`candidate` entry only when `gates.lock_decision` allows it.

`build --push` pushes by digest only: tags move in `publish`, after the
Spark proved the digest.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from spark_images.buildline import gates, serialise, steps
from spark_images.buildline.record import BuildRecord
from spark_images.buildline.stages import (
    PASSED,
    SKIPPED,
    Audited,
    Built,
    Gated,
    Locked,
    Scanned,
    StageError,
    Validated,
)
from spark_images.core import atomic
from spark_images.core.errors import EXIT_FINDING, EXIT_USAGE, SparkImagesError
from spark_images.registry.reference import ImageReference
from spark_images.release import lock

# kept here: the line's callers and tests name them as pipeline.*
source_date_epoch = steps.source_date_epoch
vllm_commit_time = steps.vllm_commit_time

Log = Callable[[str], None]
T = TypeVar("T")


@dataclass(frozen=True)
class BuildOptions:
    profile: Path
    push: ImageReference | None = None  # parsed at the CLI edge: HOST/NAME, no tag
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
    predicate_path: Path | None = None
    lock_written: bool = False
    timings: dict[str, float] = field(default_factory=dict)


class _Stopped(Exception):
    def __init__(self, stop: gates.Stop) -> None:
        super().__init__(stop.reason)
        self.stop = stop


class Line:
    def __init__(self, opts: BuildOptions, log: Log) -> None:
        self.opts = opts
        self.log = log
        self.results = serialise.Results()
        self.timings: dict[str, float] = {}

    @property
    def build_dir(self) -> Path:
        v = self.results.validated
        if self.opts.build_dir is not None:
            return self.opts.build_dir
        if v is None:
            return self.opts.profile.resolve().parent.parent / "build" / self.opts.profile.stem
        return v.base_dir / "build" / v.plan.profile_name

    def _timed(self, name: str, fn: Callable[[], T]) -> T:
        started = time.monotonic()
        try:
            return fn()
        finally:
            self.timings[name] = time.monotonic() - started

    def _gate(self, stop: gates.Stop | None) -> None:
        if stop is not None:
            self.log(f"[{stop.stage}] {stop.status}: {stop.reason}")
            raise _Stopped(stop)

    def preflight(self) -> None:
        """Engine, buildx and arm64 emulation, checked before the slow stages (exit 2)."""
        from spark_images.engine import build as engine_build

        try:
            engine_build.require_buildx()
            engine_build.emulation()
        except SparkImagesError as exc:
            raise StageError.of("build", exc) from exc

    def front(self) -> Validated:
        """validate -> audit -> render, shared by `build` and `verify-repro`."""
        r = self.results
        v = r.validated = self._timed("validate", lambda: steps.validate(self.opts.profile, self.log))
        self.build_dir.mkdir(parents=True, exist_ok=True)
        if not self.opts.dry_run:
            self._timed("preflight", self.preflight)
        a = r.audited = self._timed("audit", lambda: steps.audit(v, self.opts.vllm_repo, self.log))
        self._gate(gates.after_audit(a, v.plan.vllm_commit))
        r.rendered = self._timed("render", lambda: steps.render(v, self.build_dir))
        return v

    def back(self, v: Validated, a: Audited, work: Path) -> bool:
        """build -> cubins -> coherence -> lock; whether the lock was written."""
        r = self.results
        assert r.rendered is not None
        o = self.opts
        b = r.built = self._timed(
            "build",
            lambda: steps.build(v, a, r.rendered, work, push=o.push, ca_cert=o.ca_cert, cache=o.cache,  # type: ignore[arg-type]
                                no_cache=o.no_cache, log=self.log, timings=self.timings),
        )  # fmt: skip
        # the archive is still in `work`: one read of it gives `check` and the cubin gate
        s = r.scanned = self._timed("cubins", lambda: steps.scan(v, b, self.build_dir, a))
        self._gate(gates.after_scan(s, steps.GPU))
        self._gate(gates.after_check(s))
        if o.keep_oci:
            kept = self.build_dir / "image.oci.tar"
            os.replace(b.oci_archive, kept)
            b = r.built = dataclasses.replace(b, kept_oci=kept)
        g = r.gated = self._timed("coherence", lambda: steps.coherence(v, b, self.log))
        self._gate(gates.after_coherence(g))
        return self._timed("lock", lambda: self.write_lock(v, a, b, s, g))

    def write_lock(self, v: Validated, a: Audited, b: Built, s: Scanned, g: Gated) -> bool:
        decision = gates.lock_decision(a, s, g)
        if not decision.allowed:
            self.results.locked = Locked(SKIPPED, decision.reason)
            return False
        entry = serialise.lock_entry(v, a, b, s, g, tags=[])
        try:
            written = lock.record_candidate(self.opts.lock_path, v.plan.profile_name, entry)
        except SparkImagesError as exc:  # the lock is malformed or unreadable: it stays as it is
            raise StageError.of("lock", exc) from exc
        except OSError as exc:  # atomic: the old lock stays whole
            raise StageError("lock", f"{self.opts.lock_path}: cannot write ({exc.strerror or exc})", EXIT_USAGE) from exc
        self.results.locked = Locked(
            PASSED, path=self.opts.lock_path, image=written["image"], state=written.get("state", "")
        )
        return True

    def run(self) -> Outcome:
        code = 0
        written = False
        work: Path | None = None
        try:
            v = self.front()
            if self.opts.dry_run:
                self.results.dry_run = True
            else:
                assert self.results.audited is not None
                work = Path(tempfile.mkdtemp(prefix=".oci-", dir=self.build_dir))
                written = self.back(v, self.results.audited, work)
                code = 0 if written else EXIT_FINDING
        except StageError as err:
            self.log(f"[{err.stage}] {err.status}: {err.reason}")
            self.results.error = err
            code = err.exit_code
        except _Stopped as stopped:
            self.results.stop = stopped.stop
            code = stopped.stop.exit_code
        finally:  # an interrupt too: no partial archive stays behind
            if work is not None:
                shutil.rmtree(work, ignore_errors=True)
        return self.finish(code, written)

    def finish(self, code: int, written: bool) -> Outcome:
        record = BuildRecord(profile=self.opts.profile.stem, sections=serialise.sections(self.results))
        if self.results.validated is not None:
            record.profile = self.results.validated.plan.profile_name
        result: dict[str, Any] = {"status": "passed" if code == 0 else "failed", "exit_code": code}
        failed = [n for n, s in record.sections.items() if isinstance(s, dict) and s.get("status") in ("failed", "error")]
        if failed:
            result["reason"] = f"stage {failed[0]}: {record.sections[failed[0]].get('reason', '')}"
        elif code:
            result["reason"] = record.sections.get("lock", {}).get("reason", "")
        result["timings"] = {k: round(t, 3) for k, t in self.timings.items()}
        record.set("result", result)
        out = Outcome(record, code, lock_written=written, timings=self.timings)
        if self.results.validated is not None or self.opts.build_dir is not None:
            out.record_path = record.save(self.build_dir / "record.json")
            out.report_path = atomic.write_text(self.build_dir / "report.md", serialise.markdown(record.to_json()))
            v, a = self.results.validated, self.results.audited
            if v is not None and a is not None:
                predicate = serialise.audit_predicate(v, a, self.results.built)
                out.predicate_path = atomic.write_json(self.build_dir / "audit-predicate.json", predicate)
        return out


def run_build(opts: BuildOptions, log: Log) -> Outcome:
    return Line(opts, log).run()


@dataclass
class ReproOutcome:
    doc: dict[str, Any]
    exit_code: int


def verify_repro(opts: BuildOptions, log: Log) -> ReproOutcome:
    """Build the plan twice without cache; same manifest digest or the files that differ.

    Validate, audit and render run as in `build` (the audit may give the
    SOURCE_DATE_EPOCH; what it found never reaches the image). Nothing is
    pushed, loaded or locked.
    """
    from spark_images.buildline import repro
    from spark_images.engine import build as engine_build

    line = Line(opts, log)
    try:
        v = line.front()
    except (StageError, _Stopped) as exc:
        line.results.error = exc if isinstance(exc, StageError) else None
        line.results.stop = exc.stop if isinstance(exc, _Stopped) else None
        code = exc.exit_code if isinstance(exc, StageError) else exc.stop.exit_code
        name = line.results.validated.plan.profile_name if line.results.validated else opts.profile.stem
        return ReproOutcome({"profile": name, "stages": serialise.sections(line.results)}, code)
    a, rendered = line.results.audited, line.results.rendered
    assert a is not None and rendered is not None
    work = Path(tempfile.mkdtemp(prefix=".repro-", dir=line.build_dir))
    try:
        digests: list[str] = []
        archives: list[Path] = []
        seconds: list[float] = []
        for n in (1, 2):
            log(f"[verify-repro] build {n} of 2 (no cache)")
            try:
                request, epoch_from = steps.build_request(
                    v, a, rendered, work / f"build{n}", ca_cert=opts.ca_cert, cache=None, no_cache=True
                )
                result = engine_build.build(request, on_log=log)
            except SparkImagesError as exc:
                reason = "; ".join(exc.lines())
                doc = {"profile": v.plan.profile_name, "status": "failed", "reason": f"build {n}: {reason}"}
                return ReproOutcome(doc, exc.exit_code)
            digests.append(result.digest)
            archives.append(result.oci_archive)
            seconds.append(round(result.seconds, 3))
        same = digests[0] == digests[1]
        audit_doc = {"status": a.status, **({"reason": f"not run: {a.reason}"} if a.reason else {})}
        doc: dict[str, Any] = {
            "profile": v.plan.profile_name,
            "reproducible": same,
            "digests": digests,
            "build_seconds": seconds,
            "source_date_epoch": request.source_date_epoch,
            "source_date_epoch_from": epoch_from,
            "audit": audit_doc,
        }
        if not same:
            doc["differences"] = repro.differences(repro.listing(archives[0]), repro.listing(archives[1]))
        return ReproOutcome(doc, 0 if same else EXIT_FINDING)
    finally:
        shutil.rmtree(work, ignore_errors=True)
