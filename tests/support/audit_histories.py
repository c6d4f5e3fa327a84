"""Real git histories built with `git fast-import`, shaped like vLLM's.

`HistoryBuilder` writes a fast-import stream (commits with inline file
contents, branches, lightweight and annotated tags) and runs real git on it;
building thousands of commits takes well under a second. Building can happen
in phases, so that a later commit can quote an earlier commit's SHA (a
`cherry picked from commit` line, a `This reverts commit` body).
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

EPOCH = 1_760_000_000


def git(repo: Path, *args: str, check: bool = True) -> str:
    proc = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {proc.stderr}")
    return proc.stdout


def _data(text: str) -> str:
    raw = text.encode("utf-8")
    return f"data {len(raw)}\n{text}\n"


@dataclass
class HistoryBuilder:
    path: Path
    bare: bool = False
    stream: list[str] = field(default_factory=list)
    marks: dict[str, str] = field(default_factory=dict)
    tips: dict[str, str] = field(default_factory=dict)
    _next: int = 1
    _clock: int = EPOCH
    _initialised: bool = False
    _shas: dict[str, str] = field(default_factory=dict)

    def commit(
        self,
        branch: str,
        subject: str,
        files: dict[str, str | None] | None = None,
        *,
        body: str = "",
        parent: str | None = None,
        merge: tuple[str, ...] = (),
        name: str | None = None,
        renames: dict[str, str] | None = None,
    ) -> str:
        """Add a commit on `branch`; returns its name (use `sha(name)` after build).

        `parent` starts the branch at another commit (a cut); `files` maps a
        path to its new content, or None to delete it; `renames` maps an old path
        to its new one (a pure move: git's rename detection sees R100); no files
        and no renames = an empty commit.
        """
        mark = f":{self._next}"
        self._next += 1
        self._clock += 60
        key = name or mark
        self.marks[key] = mark
        message = subject + ("\n\n" + body if body else "") + "\n"
        lines = [
            f"commit refs/heads/{branch}",
            f"mark {mark}",
            f"author Dev <dev@example.invalid> {self._clock} +0000",
            f"committer Dev <dev@example.invalid> {self._clock} +0000",
            _data(message).rstrip("\n"),
        ]
        start = parent or self.tips.get(branch)
        if start is not None:
            lines.append(f"from {self._ref(start)}")
        lines += [f"merge {self._ref(m)}" for m in merge]
        for old, new in (renames or {}).items():
            lines.append(f'R "{old}" "{new}"')
        for path, content in (files or {}).items():
            if content is None:
                lines.append(f"D {path}")
            else:
                lines.append(f"M 100644 inline {path}")
                lines.append(_data(content).rstrip("\n"))
        self.stream.append("\n".join(lines) + "\n\n")
        self.tips[branch] = key
        return key

    def tag(self, tag: str, at: str, *, annotated: bool = False) -> None:
        at = self.tips.get(at, at)  # a branch name means its current tip
        if annotated:
            self._clock += 1
            self.stream.append(
                f"tag {tag}\nfrom {self._ref(at)}\ntagger Rel <rel@example.invalid> {self._clock} +0000\n{_data('release ' + tag)}"
            )
        else:
            self.stream.append(f"reset refs/tags/{tag}\nfrom {self._ref(at)}\n\n")

    def _ref(self, key: str) -> str:
        # marks stay valid across phases: every build imports the previous marks
        return self.marks.get(key, key)

    def build(self) -> Path:
        """Run fast-import over what was added since the last build."""
        if not self._initialised:
            self.path.mkdir(parents=True, exist_ok=True)
            git(self.path, "init", "-q", *(["--bare"] if self.bare else []), "-b", "main")
            self._initialised = True
        marks_file = self.path / ("marks" if self.bare else ".git/marks")
        args = ["fast-import", "--quiet", "--force", f"--export-marks={marks_file}"]
        if marks_file.exists():
            args.append(f"--import-marks={marks_file}")
        subprocess.run(["git", *args], cwd=self.path, input="".join(self.stream).encode(), check=True, capture_output=True)
        self.stream = []
        for line in marks_file.read_text().splitlines():
            mark, sha = line.split()
            self._shas[mark] = sha
        return self.path

    def sha(self, key: str) -> str:
        return self._shas[self.marks.get(key, key)]


def filler_files(i: int) -> dict[str, str | None]:
    return {f"vllm/misc/f{i % 50}.py": f"VALUE = {i}\n"}


# --- the vLLM-shaped fixture history -------------------------------------------
# Shape (each piece mirrors something upstream really does):
# - main is squash-merged: subjects end in `(#N)`; one true merge commit brings
#   in a side branch (#60001, #60002) to exercise non-first-parent reachability.
# - releases/v0.19.0, releases/v0.22.0, releases/v0.22.1, releases/v0.23.0 are cut
#   from main; the final tags sit on those branches, not on main.
# - v0.22.0 carries cherry-picks: #35568 with a `cherry picked from commit` line,
#   #36000 with the same subject and no line, #70001 reworded but with the line.
# - v0.22.1rc0 is tagged on main *after* the v0.22.1 cut and contains #40923,
#   which the v0.22.1 final lacks (the #40923 shape).
# - #50001 is reverted on main after the v0.22.0 cut; #51001 is reverted and the
#   revert reverted; #52001 is reverted by a commit whose subject lost the
#   number (only its `This reverts commit` body names it).
# - #39825's effect is undone by #39959 (knowledge base `undone_by`), and
#   #70001's file content is removed by #70002 (a content marker shape).
# - #41215 is an empty commit: its tree equals its parent's; its effect (the
#   enable_sm120_family routing in the FP8 dispatch header) lands with #35568.
# - #37221 moves the kernel headers under csrc/libtorch_stable/ (a rename commit),
#   after v0.22.1rc0: the knowledge base's old paths are hints from then on.
# - `v0.10.0.0` and `2024.06.25` are downstream tags that look like versions but
#   are not vLLM releases (PyPI does not list them).
# - #80001 is merged after the last cut.

FP8_DISPATCH = "csrc/quantization/w8a8/cutlass/c3x/scaled_mm_sm120_fp8_dispatch.cuh"
FP8_DISPATCH_NOW = "csrc/libtorch_stable/quantization/w8a8/cutlass/c3x/scaled_mm_sm120_fp8_dispatch.cuh"
COMMON_HPP = "csrc/cutlass_extensions/common.hpp"
COMMON_HPP_NOW = "csrc/libtorch_stable/cutlass_extensions/common.hpp"
B12X_MOE = "vllm/model_executor/layers/fused_moe/experts/flashinfer_b12x_moe.py"
B12X_LINEAR = "vllm/model_executor/kernels/linear/nvfp4/flashinfer.py"
FP8_ROUTED = "template <typename K> using D = enable_sm120_family<K>;\n"
# the releases PyPI lists for this history (the rc tags are not uploaded to PyPI)
PYPI_RELEASES = ("0.19.0", "0.22.0", "0.22.1", "0.23.0")


@dataclass
class VllmLike:
    path: Path
    builder: HistoryBuilder

    def sha(self, name: str) -> str:
        return self.builder.sha(name)


def build_vllm_like(path: Path) -> VllmLike:
    b = HistoryBuilder(path)
    n = 100

    def filler(count: int) -> None:
        nonlocal n
        for _ in range(count):
            n += 1
            b.commit("main", f"[Misc] Routine change {n} (#{n})", filler_files(n))

    b.commit(
        "main",
        "[Core] Initial import (#100)",
        {
            "vllm/__init__.py": "__all__ = []\n",
            "CMakeLists.txt": 'set(CUDA_SUPPORTED_ARCHS "8.9;9.0;12.0")\n',
            FP8_DISPATCH: "template <typename K> using D = enable_sm120<K>;\n",
        },
        name="root",
    )
    filler(10)
    b.commit("main", "[Kernel] enable_sm120_family template for SM120/SM121 (#33517)",
             {COMMON_HPP: "template <typename Kernel>\nstruct enable_sm120_family : Kernel {};\n"}, name="p33517")
    b.tag("v0.10.0.0", "main")  # downstream tags that look like versions
    b.tag("2024.06.25", "main", annotated=True)
    b.commit("main", "[Build] Fix DGX Spark logic (#38126)",
             {"CMakeLists.txt": 'set(CUDA_SUPPORTED_ARCHS "8.9;9.0;10.0;12.0;12.1")\n'}, name="p38126")
    filler(3)
    b.tag("v0.19.0rc1", "main")
    cut019 = b.tips["main"]
    b.commit("main", "[Bugfix] Disable FlashInfer CUTLASS MoE on SM121 (#39825)",
             {"vllm/moe_sm121.py": "FLASHINFER_CUTLASS_MOE_SM121 = False\n"}, name="p39825")
    filler(4)
    b.commit("main", "[MoE] Re-enable FlashInfer CUTLASS MoE on SM121 (#39959)",
             {"vllm/moe_sm121.py": "FLASHINFER_CUTLASS_MOE_SM121 = True\n"}, name="p39959")
    fork = b.tips["main"]
    b.commit("side", "[Doc] Side work a (#60001)", {"docs/a.md": "a\n"}, parent=fork, name="side1")
    b.commit("side", "[Doc] Side work b (#60002)", {"docs/b.md": "b\n"}, name="side2")
    filler(2)
    b.commit("main", "Merge branch 'side' (#60003)", {"docs/a.md": "a\n", "docs/b.md": "b\n"}, merge=("side2",), name="merge")
    b.commit("main", "[Kernel] Integrate FlashInfer b12x MoE + FP4 GEMM for SM120/121 (#40082)",
             {B12X_MOE: "from flashinfer import b12x_fused_moe\n",
              B12X_LINEAR: "class FlashInferB12xNvFp4LinearKernel(NvFp4LinearKernel):\n    pass\n"}, name="p40082")
    b.commit("main", "[Kernel] Route per-tensor FP8 through enable_sm120_family on SM12.1 (#41215)", name="p41215")
    b.commit("main", "[Misc] Risky change (#50001)", {"vllm/risky.py": "RISKY = True\n"}, name="p50001")
    b.commit("main", "[Misc] Body-revert target (#52001)", {"vllm/body.py": "X = 1\n"}, name="p52001")
    filler(2)
    b.tag("v0.22.0rc1", "main")
    cut1 = b.tips["main"]
    b.commit("main", "[Bugfix] Fix incorrect SM121 exclusion from Marlin/CUTLASS FP8 paths (#35568)",
             {"vllm/fp8.py": "SM121 = True\n", FP8_DISPATCH: FP8_ROUTED}, name="p35568")
    b.commit("main", "[Bugfix] Quiet warning (#36000)", {"vllm/warn.py": "QUIET = True\n"}, name="p36000")
    b.commit("main", 'Revert "[Misc] Risky change (#50001)" (#50003)', {"vllm/risky.py": None}, name="r50001")
    b.commit("main", "[Feature] Add FEATURE_X (#70001)", {"vllm/feature.py": "FEATURE_X = 1\n"}, name="p70001")
    filler(3)
    b.commit("main", "[Bugfix] Late fix (#37000)", {"vllm/late.py": "LATE = 1\n"}, name="p37000")
    cut2 = b.tips["main"]
    b.commit("main", "[Kernel] Marlin MoE: include SM12.x in default arch list (#40923)",
             {"CMakeLists.txt": 'set(CUDA_SUPPORTED_ARCHS "8.9;9.0;10.0;12.0;12.1")\nset(MARLIN_MOE_ARCHS "8.9;12.0;12.1")\n'},
             name="p40923")
    b.tag("v0.22.1rc0", "main")
    b.commit("main", "[Build] Move the CUTLASS kernels under csrc/libtorch_stable (#37221)",
             renames={FP8_DISPATCH: FP8_DISPATCH_NOW, COMMON_HPP: COMMON_HPP_NOW}, name="p37221")
    b.commit("main", "[Refactor] Drop FEATURE_X (#70002)", {"vllm/feature.py": "# gone\n"}, name="p70002")
    b.commit("main", "[Core] Fix async-decode output-placeholder underflow (#48245)", {"vllm/sched.py": "OK = 1\n"}, name="p48245")
    b.commit("main", "[Misc] Flaky thing (#51001)", {"vllm/flaky.py": "F = 1\n"}, name="p51001")
    b.commit("main", 'Revert "[Misc] Flaky thing (#51001)" (#51002)', {"vllm/flaky.py": None}, name="r51001")
    b.commit("main", 'Revert "Revert "[Misc] Flaky thing (#51001)" (#51002)" (#51003)', {"vllm/flaky.py": "F = 1\n"}, name="rr51001")
    filler(2)
    b.tag("v0.23.0rc0", "main")
    cut3 = b.tips["main"]
    b.commit("main", "[Misc] After the last cut (#80001)", {"vllm/after.py": "A = 1\n"}, name="p80001")
    b.build()

    # Phase 2: commits that quote SHAs of phase 1.
    b.commit("releases/v0.19.0", "[Release] Bump version (#39000)", {"vllm/version.txt": "0.19.0\n"}, parent=cut019)
    b.tag("v0.19.0", "releases/v0.19.0", annotated=True)
    b.commit("releases/v0.22.0", "[Bugfix] Fix incorrect SM121 exclusion from Marlin/CUTLASS FP8 paths (#35568)",
             {"vllm/fp8.py": "SM121 = True\n", FP8_DISPATCH: FP8_ROUTED}, body=f"(cherry picked from commit {b.sha('p35568')})", parent=cut1, name="c35568")
    b.commit("releases/v0.22.0", "[Bugfix] Quiet warning (#36000)", {"vllm/warn.py": "QUIET = True\n"}, name="c36000")
    b.commit("releases/v0.22.0", "[Release] Pick the FEATURE_X change",
             {"vllm/feature.py": "FEATURE_X = 1\n"}, body=f"(cherry picked from commit {b.sha('p70001')})", name="c70001")
    b.tag("v0.22.0", "releases/v0.22.0", annotated=True)
    b.commit("releases/v0.22.1", "[Bugfix] Late fix (#37000)", {"vllm/late.py": "LATE = 1\n"},
             body=f"Signed-off-by: Dev\n(cherry picked from commit {b.sha('p37000')})", parent=cut2, name="c37000")
    b.tag("v0.22.1", "releases/v0.22.1")
    b.commit("releases/v0.23.0", "[Release] Bump version (#79999)", {"vllm/version.txt": "0.23.0\n"}, parent=cut3)
    b.tag("v0.23.0", "releases/v0.23.0", annotated=True)
    b.commit("main", 'Revert "[Misc] Body-revert target" (#52002)', {"vllm/body.py": None},
             body=f"This reverts commit {b.sha('p52001')}.", name="r52001")
    b.build()
    return VllmLike(path=path, builder=b)




def squash_commits(repo: Path) -> dict[int, tuple[str, int]]:
    """PR -> (its squash commit on main, committer time), from the `(#N)` subjects."""
    found: dict[int, tuple[str, int]] = {}
    for line in git(repo, "log", "--format=%H %ct %s", "main").splitlines():
        sha, when, subject = line.split(" ", 2)
        if subject.endswith(")") and "(#" in subject and not subject.startswith("Revert"):
            number = subject.rsplit("(#", 1)[1][:-1]
            if number.isdigit():
                found.setdefault(int(number), (sha, int(when)))
    return found


def pin_commits(kb_text: str, repo: Path) -> str:
    """A test knowledge base with each entry's main_commit set to the fixture's squash commit."""
    import yaml

    doc = yaml.safe_load(kb_text)
    on_main = squash_commits(repo)
    for entry in doc["fixes"]:
        if entry["pr"] in on_main and "main_commit" not in entry:
            entry["main_commit"] = on_main[entry["pr"]][0]
    return yaml.safe_dump(doc, sort_keys=False)


def fixture_knowledge(repo: Path, shipped: str) -> str:
    """The shipped knowledge base with each PR the fixture history merges on main
    pointed at the fixture's squash commit (full SHA and committer date, as read off
    upstream history for the shipped file); its patch-id is left to the audit to
    compute from the history. PRs the fixture lacks keep upstream's commits. The
    fixture's own test PRs (routine fillers aside) get entries too, so that they can
    be proven by content like the real ones."""
    import yaml

    doc = yaml.safe_load(shipped)
    on_main = squash_commits(repo)
    known = {entry["pr"] for entry in doc["fixes"]}
    for pr in sorted(set(on_main) - known - {100}):
        if pr >= 30000:  # the fillers are numbered from 101
            doc["fixes"].append({"pr": pr, "title": f"fixture PR {pr}", "area": "build", "severity": "info",
                                 "symptom": "a shape of the fixture history"})
    for entry in doc["fixes"]:
        found = on_main.get(entry["pr"])
        if found is None:
            continue
        entry["main_commit"] = found[0]
        entry.pop("patch_id", None)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(found[1]))
        entry["merged"] = entry["date"] = stamp
    return yaml.safe_dump(doc, sort_keys=False)


def backport_patch(repo: Path, sha: str, prs: tuple[int, ...]) -> str:
    """A real patch of commit `sha` (`git format-patch`), headed by its Backport-Of lines."""
    header = "".join(f"Backport-Of: vllm-project/vllm#{pr}\n" for pr in prs) + f"Upstream-Commit: {sha}\n"
    return header + git(repo, "format-patch", "-1", "--stdout", sha)


def source_strategy(doc: dict) -> dict:
    """A profile document switched to the source strategy, the one whose build applies patches."""
    doc["build"]["strategy"] = "source"
    doc["build"].pop("wheel", None)
    return doc


def patch_id(repo: Path, sha: str) -> str:
    """`git patch-id --stable` of one commit, as git computes it."""
    diff = subprocess.run(["git", "diff-tree", "-p", sha], cwd=repo, capture_output=True, check=True).stdout
    out = subprocess.run(["git", "patch-id", "--stable"], cwd=repo, input=diff, capture_output=True, check=True).stdout
    return out.decode().split()[0]
