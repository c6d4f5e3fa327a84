"""BuildPlan -> Dockerfile text (Jinja, StrictUndefined, deterministic).

`render_dockerfile` is pure: the same plan gives the same bytes whatever the
cwd, time zone or locale (no dates, no paths, no environment in the output).
`write_render` lays out a build context: Dockerfile, plan.json, the patches
and the requirements lock the plan names.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import shlex
import shutil
import tempfile
from pathlib import Path

import jinja2

from spark_images import defaults
from spark_images.buildline.plan import BuildPlan
from spark_images.core import atomic, inputs
from spark_images.core.errors import Problem, UsageError
from spark_images.profiles import reqlock

TEMPLATE_PACKAGE = "spark_images"  # the templates ship inside the package (templates/)
TEMPLATE_NAME = "Dockerfile.j2"
CONTEXT_LIMIT = 16 * inputs.MiB  # a patch or lock copied into the build context
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LABEL_KEY = re.compile(r"[a-z0-9][a-z0-9.-]*[a-z0-9]")


class UnsafeValue(UsageError):
    """A plan value that no quoting can carry into a Dockerfile (a newline)."""


def _one_line(value: object) -> str:
    text = str(value)
    if _CONTROL.search(text):
        raise UnsafeValue(f"{inputs.short(repr(text), 120)}: a newline or control character cannot be written into a Dockerfile")
    return text


def _shown(text: str) -> str:
    """A path for a message: itself, or its bounded repr when it holds a control character."""
    return inputs.short(repr(text), 120) if _CONTROL.search(text) else text


def dockerfile_string(value: object) -> str:
    r"""A double-quoted Dockerfile string for ENV and LABEL: BuildKit unescapes \\, \" and
    \$ inside double quotes, so the value arrives literally and nothing expands."""
    text = _one_line(value)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def shell_word(value: object) -> str:
    """One word of a RUN line (POSIX shell quoting); the shell sees the value literally."""
    return shlex.quote(_one_line(value))


def json_string(value: object) -> str:
    """An element of an exec-form JSON array (no HTML escaping, unlike tojson)."""
    return json.dumps(_one_line(value), ensure_ascii=False)


def _key(pattern: re.Pattern[str], what: str) -> object:
    def check(value: object) -> str:
        text = str(value)
        if pattern.fullmatch(text) is None:
            raise UnsafeValue(f"{inputs.short(repr(text), 120)} is not {what}")
        return text

    return check


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
    env.filters["dq"] = dockerfile_string
    env.filters["sh"] = shell_word
    env.filters["json"] = json_string
    env.filters["line"] = _one_line
    env.filters["envkey"] = _key(_ENV_KEY, "an environment variable name")
    env.filters["labelkey"] = _key(_LABEL_KEY, "a label key")
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
    except UnsafeValue as exc:
        raise UsageError(f"{_shown(plan.profile_path)}: {exc.message}") from None
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


def context_contents(plan: BuildPlan, base_dir: Path) -> dict[str, bytes]:
    """Every file of the build context, in memory: name -> bytes. All reads and
    checks happen here, before anything is written. A patch must still be the
    bytes the plan hashed (its sha256 is in the labels)."""
    contents = {"Dockerfile": render_dockerfile(plan).encode("utf-8"), "plan.json": plan_json(plan).encode("utf-8")}
    hashes = {f"patches/{posixpath.basename(p.path)}": p.sha256 for p in plan.patches}
    for name, source in context_files(plan, base_dir).items():
        if name in contents:
            raise UsageError(f"{plan.profile_path}: {name}: two inputs have this name in the build context")
        if not source.is_file():
            raise UsageError(f"{plan.profile_path}: {name}: {inputs.display_path(source)} does not exist")
        data = inputs.read_bytes(source, what="build context file", limit=CONTEXT_LIMIT)
        if name in hashes and hashlib.sha256(data).hexdigest() != hashes[name]:
            raise UsageError(f"{plan.profile_path}: {name}: {inputs.display_path(source)} changed since it was planned (re-run)")
        contents[name] = data
    if plan.requirements_lock and "requirements.lock" in contents:
        contents.update(lock_layer_files(plan, contents.pop("requirements.lock")))
    return contents


def lock_layer_files(plan: BuildPlan, lock: bytes) -> dict[str, bytes]:
    """requirements/LAYER.lock for each of the plan's lock layers: the lock's own lines,
    split by package, so each installer stage unpacks one layer's wheels (pure)."""
    text = lock.decode("utf-8", errors="replace")
    if reqlock.layered(text, defaults.LOCK_LAYERS, defaults.LAST_LAYER) != plan.lock_layers:
        raise UsageError(f"{plan.profile_path}: {plan.requirements_lock} changed since it was planned (re-run)")
    files: dict[str, bytes] = {}
    for layer, packages in plan.lock_layers:
        header = (f"# {plan.requirements_lock}, layer {layer}: {len(packages)} of its packages "
                  f"(spark-images splits the lock by defaults.LOCK_LAYERS)")
        files[f"requirements/{layer}.lock"] = reqlock.split(text, packages, header).encode("utf-8")
    return files


_OURS = {"Dockerfile", "plan.json", "patches", "requirements", "requirements.lock"}


def _replaceable(out: Path, shown: str) -> None:
    """DIR may be replaced when it is absent, empty, or an earlier render: never a
    folder holding anything else (`render -o .` must not take the cwd with it)."""
    fix = "pass a new or empty directory"
    if not out.exists() and not out.is_symlink():
        ancestor = out.parent
        while not ancestor.exists() and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            raise UsageError(Problem(file=shown, field="", message=f"{inputs.display_path(ancestor)} is not a directory", fix=fix))
        return
    if out.is_symlink() or not out.is_dir():
        raise UsageError(Problem(file=shown, field="", message="exists and is not a directory", fix=fix))
    others = sorted(p.name for p in out.iterdir() if p.name not in _OURS)
    if others:
        raise UsageError(Problem(file=shown, field="", fix=fix,
                                 message=f"holds files render did not write ({inputs.short(', '.join(others), 120)})"))


def write_render(plan: BuildPlan, out_dir: str | Path, base_dir: Path) -> tuple[Path, Path]:
    """Write the build context into out_dir; `base_dir` resolves the plan's paths.

    Writes happen last: everything is rendered and read first, then written into
    a temporary directory beside out_dir and renamed into place, so a failure at
    any point leaves out_dir as it was (absent, or the previous render)."""
    given = Path(out_dir)
    out = Path(os.path.abspath(given))  # `-o .` has a name and a parent too
    _replaceable(out, inputs.display_path(given))
    contents = context_contents(plan, base_dir)
    parent = out.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=parent))
    old: Path | None = None
    try:
        for name, data in contents.items():
            target = tmp / name
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            # COPY keeps a context file's mode, so plan.json's lands in the image: the
            # caller's umask must not (077 would give 0600 and another digest)
            os.chmod(target, 0o644)
            for folder in target.relative_to(tmp).parents:
                os.chmod(tmp / folder, 0o755)  # mkdtemp makes tmp 0700; a build context is an ordinary folder
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=parent))
            os.replace(out, old / "previous")
        os.replace(tmp, out)
    except BaseException:
        restored = old is None
        if old is not None:
            try:
                if not out.exists():
                    os.replace(old / "previous", out)  # put the earlier render back
                restored = True
            except OSError:
                pass  # keep it where it is rather than delete the user's render
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and restored:
            shutil.rmtree(old, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return given / "Dockerfile", given / "plan.json"

