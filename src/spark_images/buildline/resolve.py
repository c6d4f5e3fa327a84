"""A profile file -> a checked Profile and its BuildPlan (the spine's thin edge).

Reads the profile and the files it names (patches, requirements lock, the
recipes its gate serves), applies
the schema and the toolchain rules, and raises one `Finding` carrying every
error at once. Warnings are returned, not raised. Paths inside a profile are
relative to the directory that holds the `profiles/` folder (the project
root for profiles/NAME.yaml).
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from pathlib import Path

from spark_images.buildline.plan import BuildPlan, make_plan
from spark_images.core import inputs
from spark_images.core.errors import Finding, Problem, SparkImagesError
from spark_images.profiles import patches as patch_headers
from spark_images.profiles import reqlock
from spark_images.profiles.patches import PATCH_LIMIT
from spark_images.profiles.profile import Profile, load_profile
from spark_images.profiles.toolchain import check_profile
from spark_images.recipes import gate as recipe_gate
from spark_images.recipes.model import RECIPE_LIMIT, Recipe, parse_recipe

LOCK_LIMIT = 4 * inputs.MiB
_FIX_PATH = "paths are relative to the folder that holds profiles/"


@dataclass(frozen=True)
class Resolved:
    profile: Profile
    plan: BuildPlan
    warnings: tuple[Problem, ...]
    base_dir: Path
    recipes: tuple[Recipe, ...] = ()  # the plan's coherence recipes, read and checked, in its order


def inside_project(base: Path, rel: str) -> Path | None:
    """The real path of REL under BASE, or None when it resolves outside BASE
    (an absolute path, `..`, or a symlink anywhere on the way pointing out)."""
    root = os.path.realpath(base)
    real = os.path.realpath(os.path.join(root, rel))
    return Path(real) if os.path.commonpath([root, real]) == root and real != root else None


def read_project_file(profile: Profile, base: Path, rel: str, field: str, what: str, limit: int) -> tuple[str | None, list[Problem]]:
    """The text of a file the profile names, or the one problem that stops it."""
    real = inside_project(base, rel)
    if real is None:
        return None, [Problem(profile.path, field, f"{rel} resolves outside the project (a symlink or ..)",
                              f"{_FIX_PATH}; keep the file inside it")]
    if not real.exists():
        return None, [Problem(profile.path, field, f"{rel} does not exist", _FIX_PATH)]
    try:
        return inputs.read_text(real, what=what, limit=limit), []
    except SparkImagesError as exc:
        reason = "; ".join(p.message for p in exc.problems)
        return None, [Problem(profile.path, field, f"{rel} cannot be read ({reason})", _FIX_PATH)]


def _lock_problems(profile: Profile, base: Path, texts: dict[str, str]) -> list[Problem]:
    rel = profile.build.requirements_lock
    if not rel:
        return []
    field = "build.requirements_lock"
    text, problems = read_project_file(profile, base, rel, field, "requirements lock", LOCK_LIMIT)
    if text is not None:
        texts[rel] = text
    if text is None:
        fix = "generate it as the header of profiles/cu130.requirements.lock shows, or remove the field"
        return [Problem(p.file, p.field, p.message, fix) if "does not exist" in p.message else p for p in problems]
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


def _patch_problems(profile: Profile, base: Path, texts: dict[str, str]) -> list[Problem]:
    """Read each patch (inside the project, a regular file); one basename per patch,
    because the build context holds them side by side under patches/."""
    problems: list[Problem] = []
    first: dict[str, int] = {}
    for i, rel in enumerate(profile.patches):
        field = f"patches[{i}]"
        name = posixpath.basename(rel)
        if name in first:
            problems.append(Problem(profile.path, field, f"{rel} has the same file name as patches[{first[name]}]",
                                    "rename one of them: the build context keeps patches by file name"))
            continue
        first[name] = i
        text, found = read_project_file(profile, base, rel, field, "patch", PATCH_LIMIT)
        problems.extend(found)
        if text is None:
            continue
        texts[rel] = text
        if not patch_headers.declared_prs(text):
            problems.append(Problem(
                profile.path, field, f"{rel} declares no upstream PR",
                "add a header line 'Backport-Of: vllm-project/vllm#N' before the diff", rule="patch-no-pr",
            ))
    return problems


def read_recipes(profile: Profile, base: Path) -> tuple[Recipe, ...]:
    """The recipes the profile's gate serves, read and checked; Finding naming each bad one."""
    recipes: list[Recipe] = []
    problems = _recipe_problems(profile, base, recipes)
    if problems:
        raise Finding(*problems)
    return tuple(recipes)


def _recipe_problems(profile: Profile, base: Path, out: list[Recipe]) -> list[Problem]:
    """Read each recipe the profile's gate serves (recipes/NAME.yaml under the project):
    it must exist, validate, and be meant for this profile and servable by its gate."""
    settings = profile.verify.coherence
    problems: list[Problem] = []
    seen: set[str] = set()
    for i, name in enumerate(settings.recipes if settings else ()):
        field = f"verify.coherence.recipes[{i}]"
        rel = recipe_gate.recipe_file(name)
        if name in seen:
            problems.append(Problem(profile.path, field, f"{name} is listed twice", "list each recipe once"))
            continue
        seen.add(name)
        text, found = read_project_file(profile, base, rel, field, "recipe", RECIPE_LIMIT)
        if text is None:
            fix = f"add {rel} (see recipes/gpt-oss-120b.yaml), or drop {name} from the list"
            problems.extend(Problem(p.file, p.field, p.message, fix) if "does not exist" in p.message else p for p in found)
            continue
        try:
            recipe = parse_recipe(text, rel)
        except SparkImagesError as exc:  # the recipe's own lines name its file and field
            fix = f"see `spark-images schema recipe`, or drop {name} from {profile.path} {field}"
            problems.extend(p if p.fix else Problem(p.file, p.field, p.message, fix) for p in exc.problems)
            continue
        found = recipe_gate.profile_problems(recipe, profile.name, profile.path, field)
        problems.extend(found)
        if not found:
            out.append(recipe)
    return problems


def base_dir_of(profile_path: str | Path) -> Path:
    return Path(profile_path).resolve().parent.parent


def resolve_profile(path: str | Path, *, read_lock: bool = True) -> Resolved:
    """The checked profile, its plan and the recipes its gate serves. `read_lock=False`
    is for `audit PROFILE`: the audit needs the commit, the required fixes and the
    patches (read here, exactly as for the build), not the Python pins the lock
    holds nor the recipes."""
    profile = load_profile(path)
    base = base_dir_of(path)
    problems = check_profile(profile)
    texts: dict[str, str] = {}
    problems.extend(_patch_problems(profile, base, texts))
    recipes: list[Recipe] = []
    locks: dict[str, str] = {}
    if read_lock:
        problems.extend(_lock_problems(profile, base, locks))
        problems.extend(_recipe_problems(profile, base, recipes))
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        raise Finding(*errors)
    try:
        relative = Path(path).resolve().relative_to(base).as_posix()
    except ValueError:
        relative = Path(path).name
    return Resolved(
        profile=profile,
        plan=make_plan(profile, texts, profile_path=relative, lock_text=next(iter(locks.values()), None)),
        warnings=tuple(p for p in problems if p.severity == "warning"),
        base_dir=base,
        recipes=tuple(recipes),
    )
