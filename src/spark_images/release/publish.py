"""Promotion rules: which lock entries may be published, and under which tags (pure).

A published tag only ever points at a digest that the lock file records and
whose gates all passed (audit, cubins and coherence). Two kinds of tag exist:

- the moving line tag (`cu130`), which follows the newest promoted digest;
- immutable tags (`cu130-98dff2a81-20261201`: CUDA line, short vLLM commit,
  UTC date of the promotion), which are created once and never moved, so a
  user can roll back to any earlier promotion by name.

Nothing here does I/O: the CLI reads the lock and the registry, asks these
functions what to do, then does it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any, Literal

from spark_images.coherence import verdict as coherence_verdict
from spark_images.core.errors import Problem
from spark_images.cubins.verdict import V_NATIVE, V_PARTIAL
from spark_images.recipes import gate as recipe_gate
from spark_images.registry.reference import ImageReference, is_digest, is_tag
from spark_images.release import lock as lockfile

SHORT_SHA_LEN = 9  # the prefix length the vLLM release notes and wheel versions use
# The build's cubin gate already required native sm_121 code in every library
# the profile names; image-wide, "partial" is normal (torch and others also
# carry code for other GPUs). JIT-only, missing or no GPU code is never promoted.
PASSING_CUBIN_VERDICTS = frozenset({V_NATIVE, V_PARTIAL})
PASSED = "passed"
# Gates recorded as {"status": ...}; a skip (no Spark GPU, no network) is not a pass.
STATUS_GATES: tuple[tuple[str, str], ...] = (
    ("audit", "run the fixes audit against this commit (it needs the vLLM history)"),
    ("coherence", "run the coherence gate on a DGX Spark against this digest first"),
)

_IMMUTABLE = re.compile(r"^(?P<line>[a-z0-9]+)-(?P<sha>[0-9a-f]{7,40})-(?P<day>\d{8})$")

TagAction = Literal["create", "move", "unchanged"]


def immutable_tag(cuda_line: str, vllm_commit: str, day: date) -> str:
    """`<cuda_line>-<short vLLM commit>-<YYYYMMDD>`, e.g. `cu130-98dff2a81-20261201`."""
    return f"{cuda_line}-{vllm_commit[:SHORT_SHA_LEN]}-{day:%Y%m%d}"


def is_immutable_tag(tag: str) -> bool:
    """True for tags of the immutable form: they may be created, never moved."""
    return _IMMUTABLE.fullmatch(tag) is not None


def tag_problems(tags: Sequence[str]) -> list[str]:
    """One line per tag that the distribution API would refuse."""
    lines = []
    for tag in tags:
        if not is_tag(tag):
            lines.append(
                f"--tag {tag!r}: not a valid tag (fix: letters, digits, '_', '.', '-'; "
                "at most 128 characters; not starting with '.' or '-')"
            )
    return lines


def _problem(lock_file: str, profile: str, field: str, message: str, fix: str) -> Problem:
    where = f"images.{profile}.{field}" if field else f"images.{profile}"
    return Problem(file=lock_file, field=where, message=message, fix=fix, rule="publish")


def promotion_problems(lock: Mapping[str, Any], profile: str, lock_file: str) -> list[Problem]:
    """Why the lock entry of `profile` may not be promoted; empty when it may.

    The entry must exist, name its image by digest, and record that every gate
    passed: a `skipped` coherence gate (no Spark GPU) is not a pass.
    """
    images = lock.get("images")
    if not isinstance(images, Mapping):
        return [
            Problem(
                file=lock_file,
                field="images",
                message="the lock file has no `images` table",
                fix="build and gate the profile first (its lock stage writes the entry)",
                rule="publish",
            )
        ]
    entry = images.get(profile)
    if not isinstance(entry, Mapping):
        known = ", ".join(sorted(str(k) for k in images)) or "none"
        return [
            _problem(
                lock_file,
                profile,
                "",
                f"no lock entry for profile {profile!r} (entries: {known})",
                "build and gate the profile first (its lock stage writes the entry)",
            )
        ]
    problems: list[Problem] = []
    ref_problems = _image_problems(entry, lock_file, profile)
    problems.extend(ref_problems)
    cubins = entry.get("cubins")
    verdict = cubins.get("verdict") if isinstance(cubins, Mapping) else None
    if verdict not in PASSING_CUBIN_VERDICTS:
        problems.append(
            _problem(
                lock_file,
                profile,
                "cubins.verdict",
                f"the cubin gate did not pass (verdict: {verdict!r})",
                "publish only an image whose sm_121 cubin check passed",
            )
        )
    for gate, fix in STATUS_GATES:
        section = entry.get(gate)
        status = section.get("status") if isinstance(section, Mapping) else None
        if status != PASSED:
            reason = section.get("reason") if isinstance(section, Mapping) else None
            detail = f"status: {status!r}" + (f", reason: {reason}" if reason else "")
            problems.append(
                _problem(lock_file, profile, f"{gate}.status", f"the {gate} gate did not pass ({detail})", fix)
            )
    recipes = entry.get("recipes")
    for i, line in enumerate(recipes if isinstance(recipes, list) else []):
        if not (isinstance(line, Mapping) and line.get("status") == PASSED):
            said = line.get("line") if isinstance(line, Mapping) else None
            problems.append(
                _problem(lock_file, profile, f"recipes[{i}].status",
                         f"a recipe did not pass ({str(said or 'no line')[:300]})",
                         "serve the profile's recipes on a DGX Spark and pass that record with --coherence")
            )
    commit = entry.get("vllm_commit")
    if not isinstance(commit, str) or not lockfile.HEX40.fullmatch(commit):
        problems.append(
            _problem(
                lock_file,
                profile,
                "vllm_commit",
                f"{commit!r} is not a 40-hex commit",
                "rebuild the profile so the lock records the full vLLM commit",
            )
        )
    return problems


def _image_problems(entry: Mapping[str, Any], lock_file: str, profile: str) -> list[Problem]:
    digest = entry.get("digest")
    repository = entry.get("repository")
    image = entry.get("image")
    problems: list[Problem] = []
    if not isinstance(digest, str) or not is_digest(digest):
        problems.append(
            _problem(lock_file, profile, "digest", f"{digest!r} is not a sha256 digest",
                     "rebuild and push the profile so the lock records the registry digest")
        )
    if not isinstance(repository, str) or split_repository(repository) is None:
        problems.append(
            _problem(lock_file, profile, "repository",
                     f"{repository!r} is not HOST/NAME of a registry repository",
                     "the lock must name the registry the candidate was pushed to, e.g. ghcr.io/OWNER/NAME")
        )
    if not problems and image != f"{repository}@{digest}":
        problems.append(
            _problem(lock_file, profile, "image", f"{image!r} is not {repository}@{digest}",
                     "the entry is inconsistent; rebuild the profile to rewrite it")
        )
    return problems


def split_repository(repository: str) -> tuple[str, str] | None:
    """`HOST[:PORT]/NAME` -> (host, name), or None when it is not a repository reference."""
    ref = ImageReference.parse_or_none(repository)
    if ref is None or ref.tag or ref.digest:
        return None
    return ref.host, ref.repository


def image_ref(entry: Mapping[str, Any]) -> ImageReference:
    """The entry's image; call only after `promotion_problems` found none."""
    split = split_repository(str(entry["repository"]))
    if split is None:  # guarded by promotion_problems; kept for type narrowing
        raise ValueError(f"bad repository {entry['repository']!r}")
    return ImageReference(split[0], split[1], digest=str(entry["digest"]))


def coherence_section(doc: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The coherence section of a build record, or the document itself when it is one."""
    inner = doc.get("coherence")
    if isinstance(inner, Mapping):
        return inner
    return doc if "status" in doc else None


def gate_result_problems(doc: Mapping[str, Any], digest: str, file: str) -> list[Problem]:
    """Why a Spark gate result may not stand for the lock entry's coherence gate.

    It must have passed, on a real sm_121 GPU (not `--assume-gpu`), against an
    image named by this very digest.
    """
    section = coherence_section(doc)

    def bad(field: str, message: str, fix: str) -> Problem:
        return Problem(file=file, field=field, message=message, fix=fix, rule="publish")

    if section is None:
        return [bad("coherence", "no coherence section", "pass the record or `spark-images coherence --json` output")]
    problems: list[Problem] = []
    status = section.get("status")
    if status == PASSED:
        # the status is a claim; the combinations are the evidence: judge them again
        derived, why = coherence_verdict.record_status(section)
        if derived != PASSED:
            problems.append(
                bad("coherence.combinations",
                    f"the record says passed, but its combinations do not show it ({why or derived})",
                    "pass the record exactly as `spark-images coherence --json` wrote it")
            )
    if status != PASSED:
        reason = section.get("reason")
        shown = repr(status)[:80]
        problems.append(
            bad("coherence.status", f"the Spark gate did not pass (status: {shown}" + (f", reason: {str(reason)[:200]})" if reason else ")"),
                "promote only a digest whose coherence gate passed on a DGX Spark")
        )
    if section.get("assumed_gpu"):
        problems.append(
            bad("coherence.assumed_gpu", "the gate ran with --assume-gpu against a stand-in server",
                "run the gate on a DGX Spark without --assume-gpu")
        )
    image = section.get("image")
    if not isinstance(image, str) or not image.endswith(f"@{digest}"):
        problems.append(
            bad("coherence.image", f"the gate ran on {repr(image)[:200]}, not on the locked digest {digest}",
                "run the gate on REPOSITORY@DIGEST of the lock entry")
        )
    return problems


Combo = tuple[str, str, str, str]  # (model, moe_backend, linear_backend, kv_cache_dtype), as `plan` lists them
COMBO_KEYS = ("model", "moe_backend", "linear_backend", "kv_cache_dtype")


def _combo_of(doc: Mapping[str, Any]) -> Combo | None:
    values = tuple(doc.get(k) for k in COMBO_KEYS)
    if not all(isinstance(v, str) for v in values):
        return None
    model, *rest = values
    return (model, *(coherence_verdict.normalize_backend(v) for v in rest))  # type: ignore[return-value]


def measured_speed(result: Mapping[str, Any]) -> float | None:
    """The combination's median decode tok/s when it was measured: a finite number above zero."""
    speed = result.get("speed")
    rate = speed.get("decode_tokens_per_s") if isinstance(speed, Mapping) else None
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isfinite(rate) or rate <= 0:
        return None
    return float(rate)


def matrix_problems(section: Mapping[str, Any], matrix: Sequence[Combo], file: str) -> list[Problem]:
    """Why a coherence record does not stand for the profile's whole matrix (models x backends x KV dtypes).

    Every combination `plan` lists must be in the record (a record for another model, or of one
    backend only, covers less than the gate promised), and the combination the record would
    choose for each model must have a measured speed: an `unknown` one (the server's token
    count could not be believed) proves nothing about how fast the image serves.
    """

    def bad(field: str, message: str, fix: str) -> Problem:
        return Problem(file=file, field=field, message=message, fix=fix, rule="publish")

    if not matrix:
        return [bad("coherence.combinations", "the profile names no verify.coherence models, so no record can stand for its gate",
                    "add verify.coherence.models to the profile and run the gate on a DGX Spark")]  # fmt: skip
    combos = section.get("combinations")
    results = [c for c in combos if isinstance(c, Mapping)] if isinstance(combos, list) else []
    by_combo: dict[Combo, list[Mapping[str, Any]]] = {}
    for result in results:
        key = _combo_of(result)
        if key is not None:
            by_combo.setdefault(key, []).append(result)
    missing = [c for c in matrix if c not in by_combo]
    if missing:
        first = " ".join(f"{k}={v}" for k, v in zip(COMBO_KEYS, missing[0], strict=True))
        return [bad("coherence.combinations",
                    f"the record does not cover the profile's coherence matrix: {len(missing)} of {len(matrix)} "
                    f"combinations missing (first: {first[:200]})",
                    "run `spark-images coherence IMAGE@DIGEST --profile PROFILE` on a DGX Spark and pass its output")]  # fmt: skip
    problems: list[Problem] = []
    for model in dict.fromkeys(c[0] for c in matrix):
        tried = [r for c in matrix if c[0] == model for r in by_combo[c]]
        chosen = coherence_verdict.select_fastest(tried)
        if chosen is not None and measured_speed(chosen) is None:
            speed = chosen.get("speed")
            why = speed.get("unknown_reason") if isinstance(speed, Mapping) else None
            label = " ".join(f"{k}={chosen.get(k)}" for k in COMBO_KEYS[1:])
            problems.append(
                bad("coherence.combinations",
                    f"the chosen combination of {str(model)[:120]} ({label[:160]}) has no measured speed"
                    + (f" ({str(why)[:200]})" if why else ""),
                    "rerun the gate against a server whose usage counts can be believed")
            )
    return problems


Command = tuple[list[str], dict[str, str]]  # a recipe's exact (argv, env), as `recipes.gate.serve_command` gives it


def _evidence_problem(run: Mapping[str, Any], command: Command, digest: str) -> tuple[str, str] | None:
    """(field, why) when a recipe run that says it passed does not show it, else None."""
    argv, env = command
    rate = run.get("decode_tok_s")
    checks = run.get("checks")
    if not recipe_gate.counts_as_passed(dict(run)):
        status, reason = repr(run.get("status"))[:40], str(run.get("reason") or "")[:200]
        return "", f"did not pass (status {status}" + (f": {reason})" if reason else ")")
    if run.get("digest") != digest:
        return ".digest", f"ran on {str(run.get('digest'))[:80]!r}, not on the locked digest {digest}"
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isfinite(rate) or rate <= 0:
        return ".decode_tok_s", "has no measured speed"
    if not (isinstance(checks, Mapping) and checks.get("status") == PASSED and checks.get("reasons") == []):
        return ".checks", "says passed, but its checks do not show it"
    if run.get("argv") != argv or run.get("env") != env:
        return ".argv", "was not served with the recipe's command as the profile's recipe file gives it now"
    if run.get("ran") != {"argv": argv, "env": env}:
        return ".ran", "the container did not run the recipe's exact command"
    return None


def recipe_problems(section: Mapping[str, Any], commands: Mapping[str, Command], digest: str, file: str) -> list[Problem]:
    """Why a coherence record does not stand for the recipes the profile's gate serves.

    `commands` maps each recipe the profile lists to its exact command. Each
    must have a run in the record that passed by its own evidence: coherent
    (its checks passed), a measured speed, on this very digest, served with
    that command and seen run by the container. A skipped recipe is never a pass.
    """

    def bad(field: str, message: str, fix: str) -> Problem:
        return Problem(file=file, field=field, message=message, fix=fix, rule="publish")

    runs = section.get("recipes")
    listed = [r for r in runs if isinstance(r, Mapping)] if isinstance(runs, list) else []
    by_name = {r.get("recipe"): (i, r) for i, r in enumerate(listed)}
    problems: list[Problem] = []
    fix = ("serve the profile's recipes on a DGX Spark (`spark-images build`, or "
           "`spark-images coherence IMAGE@DIGEST --profile PROFILE`) and pass its record")  # fmt: skip
    for name, command in commands.items():
        if name not in by_name:
            problems.append(bad("coherence.recipes", f"the record has no run of recipe {name}", fix))
            continue
        i, run = by_name[name]
        found = _evidence_problem(run, command, digest)
        if found is not None:
            problems.append(bad(f"coherence.recipes[{i}]{found[0]}", f"recipe {name} {found[1]}", fix))
    return problems


def entry_with_coherence(entry: Mapping[str, Any], section: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the lock entry whose coherence gate (and recipe lines) are the Spark job's result."""
    gate: dict[str, Any] = {"status": section.get("status")}
    if section.get("reason"):
        gate["reason"] = section["reason"]
    out = {**entry, "coherence": gate}
    runs = section.get("recipes")
    if isinstance(runs, list) and runs:
        out["recipes"] = recipe_gate.lock_recipes([dict(r) for r in runs if isinstance(r, Mapping)])
    return out


@dataclass(frozen=True)
class TagStep:
    """What promoting does to one tag: create it, move it, or leave it."""

    tag: str
    action: TagAction
    previous: str | None  # the digest the tag pointed at before, if any
    digest: str

    def to_json(self) -> dict[str, Any]:
        return {"tag": self.tag, "action": self.action, "previous": self.previous, "digest": self.digest}

    def line(self, repository: str) -> str:
        if self.action == "create":
            return f"create {repository}:{self.tag} -> {self.digest}"
        if self.action == "move":
            return f"move {repository}:{self.tag} {self.previous} -> {self.digest}"
        return f"keep {repository}:{self.tag} (already {self.digest})"


def plan_tags(
    digest: str, tags: Sequence[str], current: Mapping[str, str | None]
) -> tuple[list[TagStep], list[str]]:
    """Steps for each tag given where the registry's tags point now.

    Returns (steps, refusals). An immutable tag that already points at another
    digest is refused: moving it would break every rollback that names it.
    """
    steps: list[TagStep] = []
    refusals: list[str] = []
    for tag in dict.fromkeys(tags):
        previous = current.get(tag)
        if previous is None:
            steps.append(TagStep(tag, "create", None, digest))
        elif previous == digest:
            steps.append(TagStep(tag, "unchanged", previous, digest))
        elif is_immutable_tag(tag):
            refusals.append(
                f"--tag {tag}: immutable tag already points at {previous}, not {digest} "
                "(fix: immutable tags are never moved; promote under a new date or commit)"
            )
        else:
            steps.append(TagStep(tag, "move", previous, digest))
    return steps, refusals


def entry_with_tags(entry: Mapping[str, Any], tags: Sequence[str]) -> dict[str, Any]:
    """A copy of the lock entry whose `tags` also list `tags` (sorted, unique)."""
    old = entry.get("tags")
    existing = [str(t) for t in old] if isinstance(old, list) else []
    out = dict(entry)
    out["tags"] = sorted(set(existing) | set(tags))
    return out


def lock_pr_title(profile: str, entry: Mapping[str, Any]) -> str:
    digest = str(entry.get("digest", ""))
    return f"lock: promote {profile} to {digest[:19]} (vLLM {entry.get('vllm_version', '?')})"


def lock_pr_body(profile: str, entry: Mapping[str, Any], steps: Sequence[TagStep]) -> str:
    """Markdown for the lock pull request and the job summary."""
    repository = str(entry.get("repository", ""))
    digest = str(entry.get("digest", ""))
    cubins = entry.get("cubins") if isinstance(entry.get("cubins"), Mapping) else {}
    coherence = entry.get("coherence") if isinstance(entry.get("coherence"), Mapping) else {}
    audit = entry.get("audit") if isinstance(entry.get("audit"), Mapping) else {}
    fixes = entry.get("fixes_included") or []
    lines = [
        f"## Promote `{profile}`",
        "",
        f"Image: `{repository}@{digest}`",
        "",
        "| field | value |",
        "|---|---|",
        f"| vLLM | {entry.get('vllm_version', '?')} (`{entry.get('vllm_commit', '?')}`) |",
        f"| CUDA | {entry.get('cuda_version', '?')} ({entry.get('cuda_line', '?')}) |",
        f"| arch list | `{entry.get('arch_list', '?')}` |",
        f"| audit gate | {audit.get('status', '?')} |",
        f"| cubins gate | {cubins.get('verdict', '?')} |",
        f"| coherence gate | {coherence.get('status', '?')} |",
        f"| fixes included | {', '.join(f'#{f}' for f in fixes) if fixes else 'none recorded'} |",
        f"| created | {entry.get('created', '?')} |",
        "",
        "### Tags",
        "",
        "| tag | action | previous digest |",
        "|---|---|---|",
    ]
    for step in steps:
        lines.append(f"| `{step.tag}` | {step.action} | {f'`{step.previous}`' if step.previous else '-'} |")
    lines += [
        "",
        "Pull by digest, never by tag:",
        "",
        "```",
        f"docker pull {repository}@{digest}",
        "```",
        "",
    ]
    return "\n".join(lines)
