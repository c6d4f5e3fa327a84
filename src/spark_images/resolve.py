"""A profile file -> a checked Profile and its BuildPlan (the spine's thin edge).

Reads the profile and the files it names (patches, requirements lock), applies
the schema and the toolchain rules, and raises one `Finding` carrying every
error at once. Warnings are returned, not raised. Paths inside a profile are
relative to the directory that holds the `profiles/` folder (the project
root for profiles/NAME.yaml).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from spark_images import patches as patch_headers
from spark_images import reqlock
from spark_images.errors import Finding, Problem
from spark_images.plan import BuildPlan, make_plan
from spark_images.profiles import Profile, load_profile
from spark_images.toolchain import check_profile


@dataclass(frozen=True)
class Resolved:
    profile: Profile
    plan: BuildPlan
    warnings: tuple[Problem, ...]
    base_dir: Path


def _lock_problems(profile: Profile, base: Path) -> list[Problem]:
    rel = profile.build.requirements_lock
    if not rel:
        return []
    field = "build.requirements_lock"
    try:
        text = (base / rel).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = "does not exist" if isinstance(exc, FileNotFoundError) else f"cannot be read ({exc})"
        return [Problem(profile.path, field, f"{rel} {reason}", "generate it as the header of profiles/cu130.requirements.lock shows, or remove the field")]
    unusable = reqlock.usability_problem(text)
    if unusable:
        return [Problem(profile.path, field, f"{rel} {unusable}")]
    pins = {"torch": profile.torch.version, "flashinfer-python": profile.flashinfer.python,
            "nvidia-cutlass-dsl": profile.cutlass_dsl}
    if profile.flashinfer.cubin:
        pins["flashinfer-cubin"] = profile.flashinfer.cubin
    found = []
    for name, version, have in reqlock.pin_mismatches(text, pins):
        if have is None:  # the image will not carry it: say so, a test image may mean it
            found.append(Problem(profile.path, field, f"{rel} does not install {name} (the profile pins {name}=={version})",
                                 "regenerate the lock from the profile's pins", severity="warning", rule="lock-pin-missing"))
        else:
            found.append(Problem(profile.path, field, f"{rel} pins {name}=={have} but the profile pins {name}=={version}",
                                 "regenerate the lock from the profile's pins", rule="lock-pin-mismatch"))
    return found


def base_dir_of(profile_path: str | Path) -> Path:
    return Path(profile_path).resolve().parent.parent


def resolve_profile(path: str | Path) -> Resolved:
    profile = load_profile(path)
    base = base_dir_of(path)
    problems = check_profile(profile)
    texts: dict[str, str] = {}
    for i, rel in enumerate(profile.patches):
        field = f"patches[{i}]"
        source = base / rel
        try:
            text = source.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = "does not exist" if isinstance(exc, FileNotFoundError) else f"cannot be read ({exc})"
            problems.append(Problem(profile.path, field, f"{rel} {reason}", "paths are relative to the folder that holds profiles/"))
            continue
        texts[rel] = text
        if not patch_headers.declared_prs(text):
            problems.append(Problem(
                profile.path, field, f"{rel} declares no upstream PR",
                "add a header line 'Backport-Of: vllm-project/vllm#N' before the diff", rule="patch-no-pr",
            ))
    problems.extend(_lock_problems(profile, base))
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        raise Finding(*errors)
    try:
        relative = Path(path).resolve().relative_to(base).as_posix()
    except ValueError:
        relative = Path(path).name
    return Resolved(
        profile=profile,
        plan=make_plan(profile, texts, profile_path=relative),
        warnings=tuple(p for p in problems if p.severity == "warning"),
        base_dir=base,
    )
