"""BuildPlan -> Dockerfile text (Jinja, StrictUndefined, deterministic).

`render_dockerfile` is pure: the same plan gives the same bytes whatever the
cwd, time zone or locale (no dates, no paths, no environment in the output).
`write_render` lays out a build context: Dockerfile, plan.json, the patches
and the requirements lock the plan names.
"""

from __future__ import annotations

import json
import posixpath
import shutil
from pathlib import Path

import jinja2

from spark_images import atomic
from spark_images.errors import UsageError
from spark_images.plan import BuildPlan

TEMPLATE_PACKAGE = "spark_images"  # the templates ship inside the package (templates/)
TEMPLATE_NAME = "Dockerfile.j2"


def _quote(value: object) -> str:
    """A double-quoted Dockerfile/JSON string (no HTML escaping, unlike tojson)."""
    return json.dumps(str(value), ensure_ascii=False)


def _environment(template_dir: Path | None) -> jinja2.Environment:
    loader: jinja2.BaseLoader = (
        jinja2.PackageLoader(TEMPLATE_PACKAGE, "templates")
        if template_dir is None
        else jinja2.FileSystemLoader(str(template_dir))
    )
    env = jinja2.Environment(
        loader=loader,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,  # a Dockerfile, not HTML
    )
    env.filters["quote"] = _quote
    env.filters["basename"] = posixpath.basename
    return env


def render_dockerfile(plan: BuildPlan, template_dir: Path | None = None) -> str:
    where = f"{template_dir or TEMPLATE_PACKAGE + ':templates'}/{TEMPLATE_NAME}"
    try:
        template = _environment(template_dir).get_template(TEMPLATE_NAME)
        text = template.render(plan=plan)
    except jinja2.TemplateNotFound:
        raise UsageError(f"{where}: template not found") from None
    except jinja2.UndefinedError as exc:
        raise UsageError(f"{where}: {exc}") from None
    # one trailing newline, no trailing blanks: stable bytes for golden files
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()) + "\n"


def plan_json(plan: BuildPlan) -> str:
    return atomic.dumps_json(plan.to_json())


def context_files(plan: BuildPlan, base_dir: Path) -> dict[str, Path]:
    """Files the build context needs besides Dockerfile/plan.json: name -> source."""
    files: dict[str, Path] = {}
    for patch in plan.patches:
        files[f"patches/{posixpath.basename(patch.path)}"] = base_dir / patch.path
    if plan.requirements_lock:
        files["requirements.lock"] = base_dir / plan.requirements_lock
    return files


def write_render(plan: BuildPlan, out_dir: str | Path, base_dir: Path) -> tuple[Path, Path]:
    """Write the build context into out_dir; `base_dir` resolves the plan's paths."""
    out = Path(out_dir)
    dockerfile = atomic.write_text(out / "Dockerfile", render_dockerfile(plan))
    plan_file = atomic.write_text(out / "plan.json", plan_json(plan))
    for name, source in context_files(plan, base_dir).items():
        if not source.is_file():
            raise UsageError(f"{plan.profile_path}: {name}: {source} does not exist")
        target = out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    return dockerfile, plan_file
