"""The recipe check: a recipe's exact serve command against what the image's vLLM defines (pure).

Facts in (`VllmFacts` from the image's source, the check's GPU library
documents with kernel classes, the installed packages), reasons out, one per
problem, each naming its rule:
- `unknown-flag` (broken): `vllm serve` exits on an option its parser lacks;
- `ignored-env-var` (degraded): a VLLM_* variable the image's envs.py lacks is ignored;
- `unknown-backend` (broken): a --moe/--linear/--attention-backend value the image does not define;
- `unsupported-quantization` (broken): --quantization, the KV-cache dtype or the
  checkpoint's format is not in the image's registries;
- `kernels-missing`: the backend the recipe picks needs kernels the cubin scan
  shows are not native on sm_121 (`kernels`): degraded when they JIT from PTX,
  broken when there is no code for it at all.
Where a fact could not be read (a file absent from the target) the rule says
so in `notes` and judges nothing: absence of evidence is not a pass or a finding.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spark_images.check.rules import Impact, Reason
from spark_images.check.vllm_source import VllmFacts
from spark_images.recipes import gate
from spark_images.recipes.kernels import needs
from spark_images.recipes.model import Recipe

# the checkpoint's format -> quantization methods of vLLM that load it (any one will do)
LOADERS: dict[str, tuple[str, ...]] = {
    "nvfp4": ("modelopt_fp4", "compressed-tensors", "modelopt"),
    "mxfp4": ("mxfp4", "gpt_oss_mxfp4"),
    "fp8": ("fp8", "compressed-tensors", "modelopt"),
    "gptq-int4": ("gptq", "gptq_marlin"),
    "awq-int4": ("awq", "awq_marlin"),
    "gguf": ("gguf",),
}
BACKEND_FLAGS = {"--moe-backend": "moe_backends", "--linear-backend": "linear_backends",
                 "--attention-backend": "attention_backends"}  # fmt: skip


@dataclass
class RecipeCheck:
    reasons: list[Reason] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, impact: Impact, rule: str, subject: str, message: str, fix: str) -> None:
        self.reasons.append(Reason(impact, rule, subject, message, fix))


@dataclass(frozen=True)
class Option:
    flag: str  # as vLLM's parser normalises it: --under_scores -> --under-scores, -O3 -> --optimization-level
    given: str  # as the recipe wrote it
    value: str | None


def options(args: Sequence[str]) -> list[Option]:
    """The options of a serve argument list, normalised the way FlexibleArgumentParser does."""
    out: list[Option] = []
    i = 0
    while i < len(args):
        arg = args[i]
        value: str | None = None
        if arg.startswith("--"):
            key, eq, inline = arg.partition("=")
            base = key[2:].partition(".")[0]  # --compilation-config.mode: the base flag
            flag = "--" + base.replace("_", "-")
            if eq:
                value = inline
            elif i + 1 < len(args) and not args[i + 1].startswith("-"):
                value = args[i + 1]
                i += 1
            out.append(Option(flag, arg, value))
        elif arg.startswith("-O") and arg != "-O":
            out.append(Option("--optimization-level", arg, arg[2:].lstrip("=")))
        elif arg.startswith("-") and len(arg) > 1:
            if i + 1 < len(args) and not args[i + 1].startswith("-"):
                value = args[i + 1]
                i += 1
            out.append(Option(arg.split("=", 1)[0], arg, value))
        i += 1
    return out


def _known_flag(flag: str, flags: frozenset[str]) -> bool:
    if flag in flags:
        return True
    if flag == "--optimization-level":
        return "-O" in flags or "--optimization-level" in flags
    # argparse (allow_abbrev) takes an unambiguous prefix of a long option
    return flag.startswith("--") and len([f for f in flags if f.startswith(flag)]) == 1


def _flags(check: RecipeCheck, opts: Sequence[Option], facts: VllmFacts, version: str) -> None:
    if facts.flags is None:
        check.notes.append("unknown-flag: vllm/engine/arg_utils.py is not in the target, so its serve flags are unknown")
        return
    for opt in opts:
        if not _known_flag(opt.flag, facts.flags):
            close = difflib.get_close_matches(opt.flag, sorted(facts.flags), n=1, cutoff=0.75)
            fix = f"did you mean {close[0]}?" if close else f"drop it: vLLM {version} has no such option"
            check.add("broken", "unknown-flag", opt.flag,
                      f"{opt.given}: vLLM {version}'s serve parser defines no {opt.flag}, so vllm serve exits", fix)


def _env(check: RecipeCheck, env: Mapping[str, str], facts: VllmFacts, version: str) -> None:
    if facts.env_vars is None:
        check.notes.append("ignored-env-var: vllm/envs.py is not in the target, so its variables are unknown")
        return
    for name in sorted(env):
        if name.startswith("VLLM_") and name not in facts.env_vars:
            check.add("degraded", "ignored-env-var", name,
                      f"{name} is not in vLLM {version}'s vllm/envs.py, so vLLM ignores it without a word",
                      "drop it; pass the serve flag that replaced it (e.g. --linear-backend, --moe-backend)")
        elif name in facts.deprecated_env:
            check.notes.append(f"{name} is deprecated in vLLM {version} (removal in {facts.deprecated_env[name]})")


def _choice(check: RecipeCheck, rule: str, what: str, value: str, known: frozenset[str] | None,
            version: str, source: str) -> None:
    if known is None:
        check.notes.append(f"{rule}: {source} is not in the target, so {what} names are unknown")
        return
    if value not in known:
        close = difflib.get_close_matches(value, sorted(known), n=1, cutoff=0.6)
        fix = f"did you mean {close[0]}?" if close else f"use one of vLLM {version}'s: {', '.join(sorted(known))}"
        check.add("broken", rule, what, f"{what} {value!r} is not one vLLM {version} defines ({source})", fix)


def _backends(check: RecipeCheck, opts: Sequence[Option], facts: VllmFacts, version: str) -> dict[str, str]:
    chosen: dict[str, str] = {}
    for opt in opts:
        attr = BACKEND_FLAGS.get(opt.flag)
        if attr is None or opt.value is None:
            continue
        if opt.flag == "--attention-backend":
            value = opt.value.upper()
            if value == "AUTO":
                continue
        else:  # vLLM reads these with `s.lower().replace("-", "_")`
            value = opt.value.lower().replace("-", "_")
            chosen[opt.flag] = value
        source = "AttentionBackendEnum" if attr == "attention_backends" else "vllm/config/kernel.py"
        _choice(check, "unknown-backend", opt.flag, value, getattr(facts, attr), version, source)
    return chosen


def _quantization(check: RecipeCheck, recipe: Recipe, opts: Sequence[Option], facts: VllmFacts, version: str) -> None:
    for opt in opts:
        if opt.flag in ("--quantization", "-q") and opt.value is not None:
            _choice(check, "unsupported-quantization", "--quantization", opt.value, facts.quantizations, version,
                    "QuantizationMethods")
    _choice(check, "unsupported-quantization", "--kv-cache-dtype", recipe.limits.kv_cache_dtype,
            facts.kv_cache_dtypes, version, "CacheDType")
    loaders = LOADERS.get(recipe.model.quantization)
    if loaders and facts.quantizations is not None and not set(loaders) & facts.quantizations:
        check.add("broken", "unsupported-quantization", "model.quantization",
                  f"a {recipe.model.quantization} checkpoint needs one of {', '.join(loaders)}, "
                  f"and vLLM {version}'s QuantizationMethods has none", "use a checkpoint format this vLLM loads")


def _kernels(check: RecipeCheck, recipe: Recipe, chosen: Mapping[str, str],
             libraries: Sequence[Mapping[str, Any]], packages: Iterable[str]) -> None:
    moe_backend = chosen.get("--moe-backend", "auto")
    linear_backend = chosen.get("--linear-backend", "auto")
    for backend in {moe_backend, linear_backend} & {"auto"}:
        check.notes.append(f"kernels-missing: a backend is {backend}: vLLM's oracle picks it at start, so its kernels are not judged here")
    for need in needs(recipe.model.quantization, recipe.model.moe, moe_backend, linear_backend, libraries, packages):
        if need.met:
            continue
        impact: Impact = "degraded" if need.found == "jit_only" else "broken"
        how = {"jit_only": "only as PTX (JIT-compiled at start, not native sm_121 code)",
               "missing": "with no code sm_121 can run", "absent": "not at all"}[need.found]  # fmt: skip
        check.add(impact, "kernels-missing", need.library, f"{need.what}: the image has them {how} ({need.library})",
                  "use an image whose cubin scan shows them native, or another backend (see recipe check --json notes)")


def check_recipe(
    recipe: Recipe,
    facts: VllmFacts,
    *,
    version: str | None,
    libraries: Sequence[Mapping[str, Any]] = (),
    packages: Iterable[str] = (),
) -> RecipeCheck:
    """Every reason the recipe's exact command would fail or degrade on this image."""
    check = RecipeCheck()
    label = version or "(version unknown)"
    argv, env = gate.serve_command(recipe)
    opts = options(argv[3:])
    _flags(check, opts, facts, label)
    _env(check, env, facts, label)
    chosen = _backends(check, opts, facts, label)
    _quantization(check, recipe, opts, facts, label)
    _kernels(check, recipe, chosen, libraries, packages)
    order = {"broken": 0, "degraded": 1}
    check.reasons.sort(key=lambda r: order[r.impact])
    return check
