"""Audit speed on a vLLM-sized history, against a naive per-PR git loop.

Builds (with `git fast-import`) a squash-merged main of 40,000 commits with
10 release branches cut from it (cherry-picks with `-x` lines, final tags on
the branches, rc tags on main, a Spark-signal commit every 400), writes a
commit-graph as the cache clone does, then times in one process:

  ours, 1 commit   : 20 PRs audited against one commit (a fresh Auditor: the
                     whole cost, history gathering included; first releases
                     too, against PyPI's release list as the warm per-index
                     cache holds it); cold = first run (parses all of main
                     from `git log`), warm = second run (main read from the
                     per-repository cache; git asked only for new commits)
  ours, 10 releases: the same 20 PRs against each of the 10 final releases
  naive            : per PR, find its squash commit (`git log --grep`) and
                     `git tag --contains` it (what people script by hand; it
                     still misses cherry-picks and reverts)
  --discover       : Spark-relevant PRs of one release range (vA..vB), against
                     a plain `git log -p vA..vB` of the same range (ratio)

Targets: 1 commit <= 1 s warm, 10 releases <= 3 s. Run: .venv/bin/python benchmarks/audit.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from spark_images.audit import Auditor, open_history, parse_knowledge
from spark_images.audit.pypi_releases import Catalog

MAIN_COMMITS = 40_000
RELEASES = 10
PRS = 20
EPOCH = 1_700_000_000


def _data(text: str) -> str:
    return f"data {len(text.encode())}\n{text}\n"


def build(path: Path) -> tuple[list[int], list[str], dict[int, str]]:
    """The history; returns (the 20 PR numbers of interest, the final tags, their squash commits)."""
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(path)], check=True)
    out: list[str] = []
    clock = EPOCH
    interest = [40_000 + 977 * i for i in range(PRS)]
    interest_at = {1_000 * (i + 1) - 7: pr for i, pr in enumerate(interest)}  # spread over main
    cut_every = MAIN_COMMITS // (RELEASES + 1)
    cuts: list[int] = []
    pr_of_mark: dict[int, int] = {}
    for i in range(1, MAIN_COMMITS + 1):
        clock += 30
        pr = interest_at.get(i, 10_000 + i)
        pr_of_mark[i] = pr
        subject = f"[Kernel] Spark change {pr} (#{pr})" if i in interest_at else f"[Misc] Routine change {i} (#{pr})"
        if i % 997 == 0:  # an occasional revert of the previous commit
            subject = f'Revert "[Misc] Routine change {i - 1} (#{pr_of_mark[i - 1]})" (#{pr})'
        content = f"V = {i}"
        if i % 400 == 0:  # a Spark-relevant PR nobody curated: in the subject, or only in the diff
            subject = f"[Kernel] Tune for SM121 {i} (#{pr})" if i % 800 else subject
            content = f"if current_platform.is_device_capability_family(120):\n    V = {i}"
        body = f"{subject}\n\nSummary of the change {i}.\n\nSigned-off-by: Dev <dev@example.invalid>\n"
        out.append(f"commit refs/heads/main\nmark :{i}\ncommitter Dev <dev@example.invalid> {clock} +0000\n{_data(body)}")
        if i > 1:
            out.append(f"from :{i - 1}\n")
        if i in interest_at:  # a PR of interest adds a file of its own, so a cherry-pick has the same patch-id
            out.append(f"M 100644 inline vllm/spark/{pr}.py\n{_data(f'SPARK = {pr}')}\n")
        else:
            out.append(f"M 100644 inline vllm/f{i % 200}.py\n{_data(content)}\n")
        if i % cut_every == 0 and len(cuts) < RELEASES:
            cuts.append(i)
    marks = path / "marks"
    subprocess.run(["git", "fast-import", "--quiet", f"--export-marks={marks}"], cwd=path,
                   input="".join(out).encode(), check=True)
    # cherry-pick lines name real SHAs, so the branches come in a second import
    sha_of = dict(line.split() for line in marks.read_text().splitlines())
    out = []
    mark = MAIN_COMMITS
    finals: list[str] = []
    for n, cut in enumerate(cuts):
        version = f"0.{10 + n}.0"
        # rc on main at the cut; the final on its branch with two cherry-picks of later PRs
        out.append(f"reset refs/tags/v{version}rc0\nfrom :{cut}\n\n")
        prev = cut
        later = [m for m in interest_at if m > cut]
        for k in (1, 2):
            mark += 1
            clock += 30
            # the first pick backports the next PR of interest (its change, so its patch-id), the second a routine one
            picked = min(later) if k == 1 and later else cut + 40 * k
            pr = pr_of_mark[picked]
            change = (f"M 100644 inline vllm/spark/{pr}.py\n{_data(f'SPARK = {pr}')}\n" if picked in interest_at
                      else f"M 100644 inline vllm/pick{k}.py\n{_data(str(pr))}\n")
            body = f"[Bugfix] Picked {pr} (#{pr})\n\n(cherry picked from commit {sha_of[f':{picked}']})\n"
            out.append(
                f"commit refs/heads/releases/v{version}\nmark :{mark}\ncommitter Rel <rel@example.invalid> {clock} +0000\n"
                f"{_data(body)}from :{prev}\n{change}"
            )
            prev = mark
        out.append(f"tag v{version}\nfrom :{prev}\ntagger Rel <rel@example.invalid> {clock} +0000\n{_data('v' + version)}")
        finals.append(f"v{version}")
    subprocess.run(["git", "fast-import", "--quiet", f"--import-marks={marks}"], cwd=path,
                   input="".join(out).encode(), check=True)
    subprocess.run(["git", "commit-graph", "write", "--reachable"], cwd=path, check=True)
    return interest, finals, {pr: sha_of[f":{m}"] for m, pr in interest_at.items()}


def cpu_s() -> float:
    """CPU seconds of this process and its finished children (git): a figure
    that, unlike wall time, does not grow when the machine is busy."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def naive(repo: Path, prs: list[int]) -> float:
    start = time.perf_counter()
    for pr in prs:
        found = subprocess.run(["git", "log", "-1", "--format=%H", "--fixed-strings", f"--grep=(#{pr})", "main"],
                               cwd=repo, capture_output=True, text=True, check=True).stdout.strip()
        subprocess.run(["git", "tag", "--contains", found], cwd=repo, capture_output=True, check=True)
    return time.perf_counter() - start


def one_commit(repo: Path, kb: object, catalog: Catalog, prs: list[int]) -> tuple[float, float]:
    start, cpu0 = time.perf_counter(), cpu_s()
    auditor = Auditor(open_history(repo), kb, catalog=catalog)  # type: ignore[arg-type]
    head = auditor.resolve_commit("main", "main")
    one = auditor.audit(head, target="main", prs=prs)
    elapsed, cpu = time.perf_counter() - start, cpu_s() - cpu0
    assert all(f.state in ("included", "reverted") for f in one.fixes), [f.state for f in one.fixes]
    assert all(f.first_release and f.first_rc for f in one.fixes if f.state == "included"), [f.first_release for f in one.fixes]
    return elapsed, cpu


def knowledge(commits: dict[int, str]) -> object:
    """The 20 PRs as knowledge-base entries: `included` is proven by their main commits
    (on main) and by patch-ids (the release branches' cherry-picks)."""
    rows = "".join(f"  - {{pr: {pr}, title: t, area: build, severity: info, symptom: s, main_commit: {sha}}}\n"
                   for pr, sha in sorted(commits.items()))
    return parse_knowledge("schema: 1\nfixes:\n" + rows)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="audit-bench-") as tmp:
        os.environ["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")  # the main-history cache of this run only
        repo = Path(tmp) / "vllm.git"
        t0 = time.perf_counter()
        prs, finals, commits = build(repo)
        kb = knowledge(commits)
        count = subprocess.run(["git", "rev-list", "--all", "--count"], cwd=repo, capture_output=True, text=True).stdout.strip()
        print(f"history: {count} commits, {len(finals)} release branches, built in {time.perf_counter() - t0:.1f} s")
        # PyPI's release list as the per-index cache holds it after the first run
        catalog = Catalog("http://127.0.0.1:9/simple", [t.removeprefix("v") for t in finals])

        t_cold, _ = one_commit(repo, kb, catalog, prs)
        t_one, c_one = one_commit(repo, kb, catalog, prs)

        start, cpu0 = time.perf_counter(), cpu_s()
        auditor = Auditor(open_history(repo), kb, catalog=catalog)
        states = 0
        picked = 0
        for tag in finals:
            report = auditor.audit(auditor.resolve_commit(f"refs/tags/{tag}", tag), target=tag, prs=prs)
            states += len(report.fixes)
            picked += sum(f.state == "cherry-picked" for f in report.fixes)
        assert picked, "the release branches' cherry-picks are proven by patch-id"
        t_ten, c_ten = time.perf_counter() - start, cpu_s() - cpu0

        t_naive = naive(repo, prs)

        lo, hi = finals[3], finals[4]
        start = time.perf_counter()
        auditor = Auditor(open_history(repo), kb, catalog=catalog)
        found, shown = auditor.discover(auditor.resolve_commit(f"refs/tags/{hi}", hi), lo)
        t_disc = time.perf_counter() - start
        in_range = subprocess.run(["git", "rev-list", "--count", f"{lo}..{hi}"], cwd=repo, capture_output=True, text=True).stdout.strip()
        start = time.perf_counter()
        subprocess.run(["git", "log", "-p", f"{lo}..{hi}"], cwd=repo, stdout=subprocess.DEVNULL, check=True)
        t_logp = time.perf_counter() - start
        assert found, "the range holds Spark-signal commits"

        print(f"ours, {PRS} PRs x 1 commit    : {t_one:6.3f} s warm (cold {t_cold:.3f} s)  (target <= 1 s)  "
              f"{'OK' if t_one <= 1 else 'SLOW'}  cpu {c_one:.3f} s")
        print(f"ours, {PRS} PRs x {RELEASES} releases : {t_ten:6.3f} s  (target <= 3 s)  {'OK' if t_ten <= 3 else 'SLOW'}  cpu {c_ten:.3f} s  [{states} verdicts, {picked} cherry-picks proven by patch-id]")
        print(f"naive per-PR `git tag --contains` loop, {PRS} PRs: {t_naive:6.3f} s")
        print(f"ratio naive / ours (1 commit)  : {t_naive / t_one:5.1f}x")
        print(f"ratio naive / ours (10 releases): {t_naive / t_ten:5.1f}x  (naive answers 1 question per PR, ours {RELEASES})")
        print(f"--discover {shown} ({in_range} commits, {len(found)} found): {t_disc:6.3f} s; "
              f"plain `git log -p {lo}..{hi}`: {t_logp:6.3f} s; ratio discover / log -p: {t_disc / t_logp:4.2f}x")
        return 0 if t_one <= 1 and t_ten <= 3 else 1


if __name__ == "__main__":
    sys.exit(main())
