"""The only module of the project that runs git.

It gathers data and decides nothing: commits as `CommitInfo`, tags, files at a
commit, shallow boundaries, and the cached treeless clone of upstream vLLM.
Every git failure becomes a one-line `EnvironmentProblem`/`UsageError`.
What git prints is split into data by the pure `git_parse.py`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from spark_images import defaults
from spark_images.audit import git_parse as parse
from spark_images.audit._problems import problem
from spark_images.audit.git_parse import HEX, TagRef
from spark_images.audit.history import CommitInfo
from spark_images.core.errors import EnvironmentProblem, Problem, UsageError

UPSTREAM_URL = defaults.VLLM_GIT_URL
MAIN_REFS: tuple[str, ...] = ("refs/heads/main", "refs/remotes/origin/main", "refs/remotes/upstream/main")
_STAMP = "spark-images-fetched"


def _env(lazy_fetch: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C", "GIT_OPTIONAL_LOCKS": "0"})
    if not lazy_fetch:
        # honoured by git >= 2.44; older git ignores it (then we only avoid
        # commands that need trees, e.g. `log --no-mailmap`).
        env["GIT_NO_LAZY_FETCH"] = "1"
    else:
        env.pop("GIT_NO_LAZY_FETCH", None)
    return env


def _run(
    args: Sequence[str],
    *,
    cwd: Path | None = None,
    stdin: bytes | None = None,
    timeout: float = 120.0,
    lazy_fetch: bool = False,
) -> subprocess.CompletedProcess[bytes]:
    if shutil.which("git") is None:
        raise EnvironmentProblem(problem("git is not installed (install git >= 2.30)"))
    try:
        return subprocess.run(
            ["git", *args],
            cwd=cwd,
            input=stdin,
            capture_output=True,
            timeout=timeout,
            env=_env(lazy_fetch),
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise EnvironmentProblem(problem(f"git {args[0]} took longer than {timeout:.0f}s in {cwd}")) from None


# `git cat-file` over stdin: each object's full name and type ("<name> missing" / "ambiguous" otherwise)
_BATCH_TYPES = ["cat-file", "--batch-check=%(objectname) %(objecttype)"]


class Repo:
    """A local git repository (work tree or bare) holding vLLM history."""

    def __init__(self, path: Path, timeout: float = 120.0) -> None:
        self.path = Path(path)
        self.timeout = timeout
        if not self.path.exists():
            raise UsageError(problem(f"{self.path}: no such directory (--repo must name a git clone of vLLM)"))
        proc = _run(["rev-parse", "--absolute-git-dir"], cwd=self.path, timeout=timeout)
        if proc.returncode != 0:
            raise UsageError(problem(f"{self.path}: not a git repository ({parse.last_line(proc.stderr)})"))
        self.git_dir = Path(proc.stdout.decode().strip())

    # -- plumbing ---------------------------------------------------------
    def git(self, *args: str, stdin: bytes | None = None, lazy_fetch: bool = False, timeout: float | None = None) -> bytes:
        proc = _run(args, cwd=self.path, stdin=stdin, timeout=timeout or self.timeout, lazy_fetch=lazy_fetch)
        if proc.returncode != 0:
            raise EnvironmentProblem(problem(f"{self.path}: git {args[0]} failed: {parse.last_line(proc.stderr)}"))
        return proc.stdout

    def _try(self, *args: str) -> bytes | None:
        proc = _run(args, cwd=self.path, timeout=self.timeout)
        return proc.stdout if proc.returncode == 0 else None

    # -- facts about the clone -------------------------------------------
    def is_shallow(self) -> bool:
        out = self._try("rev-parse", "--is-shallow-repository")
        return (out or b"").strip() == b"true" or (self.git_dir / "shallow").is_file()

    def shallow_commits(self) -> list[str]:
        path = self.git_dir / "shallow"
        if not path.is_file():
            return []
        return [ln.strip() for ln in path.read_text().splitlines() if ln.strip()]

    def grafts(self) -> list[str]:
        """Commits whose parents are rewritten (info/grafts or `git replace --graft`)."""
        found: list[str] = []
        grafts = self.git_dir / "info" / "grafts"
        if grafts.is_file():
            found += [ln.split()[0] for ln in grafts.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
        out = self._try("for-each-ref", "--format=%(refname:strip=2)", "refs/replace/")
        found += [ln for ln in (out or b"").decode().splitlines() if ln]
        return found

    def is_partial(self) -> bool:
        out = self._try("config", "--get-regexp", r"^(extensions\.partialclone|remote\..*\.promisor)$")
        return bool(out and out.strip())

    # -- names and objects -------------------------------------------------
    def resolve_commit(self, rev: str) -> str | None:
        out = self._try("rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}")
        return out.decode().strip() if out else None

    def commits_with_prefix(self, prefix: str) -> list[str]:
        """Every commit whose SHA starts with `prefix` (to report ambiguity)."""
        if not HEX.match(prefix):
            return []
        out = self._try("rev-parse", f"--disambiguate={prefix}") or b""
        objects = out.decode().split()
        if not objects:
            return []
        check = self._try_stdin(_BATCH_TYPES, "\n".join(objects) + "\n")
        return sorted(ln.split()[0] for ln in check.splitlines() if ln.endswith(" commit"))

    def commits_with_prefixes(self, prefixes: Iterable[str]) -> dict[str, list[str]]:
        """`commits_with_prefix` of many prefixes, in one git run for all but the
        ambiguous ones (a release list asks for ~40; one run each cost ~0.25 s)."""
        wanted = sorted({p for p in prefixes if HEX.match(p)})
        if not wanted:
            return {}
        out: dict[str, list[str]] = {p: [] for p in wanted}
        check = self._try_stdin(_BATCH_TYPES, "\n".join(wanted) + "\n")
        lines = check.splitlines()
        if len(lines) != len(wanted):  # git said something else: ask one by one
            return {p: self.commits_with_prefix(p) for p in wanted}
        for prefix, line in zip(wanted, lines, strict=True):
            name, _, kind = line.partition(" ")
            if kind == "ambiguous" or (kind not in ("missing", "") and not name.startswith(prefix)):
                out[prefix] = self.commits_with_prefix(prefix)  # ambiguous, or a ref of that name answered
            elif kind == "commit":
                out[prefix] = [name]
        return out

    def _try_stdin(self, args: list[str], text: str) -> str:
        proc = _run(args, cwd=self.path, stdin=text.encode(), timeout=self.timeout)
        return proc.stdout.decode("utf-8", "replace") if proc.returncode == 0 else ""

    def main_ref(self) -> str | None:
        """The newest of main / origin/main / upstream/main: a work clone's local
        main is often behind, and commits past it would look like a branch."""
        out = self._try("for-each-ref", "--sort=-committerdate", "--format=%(refname)", *MAIN_REFS) or b""
        present = out.decode().split()
        return present[0] if present else None

    def tags(self) -> list[TagRef]:
        out = self._try("for-each-ref", f"--format={parse.TAG_FORMAT}", "refs/tags/") or b""
        return parse.parse_tags(out)

    # -- history -----------------------------------------------------------
    def log(self, revs: Sequence[str], *, bodies: bool) -> list[CommitInfo]:
        """Commits reachable from `revs` (git rev syntax, `^X` excludes)."""
        if not revs:
            return []
        fmt = parse.LOG_FORMAT_FULL if bodies else parse.LOG_FORMAT_LEAN
        out = self.git(
            "-c", "core.commitGraph=true", "log", "--no-mailmap", "-z", f"--format={fmt}", *revs, "--",
        )
        return parse.parse_log(out)

    def messages(self, shas: Iterable[str]) -> dict[str, tuple[str, str]]:
        """(subject, body) of the given commits; unknown ones are left out."""
        wanted = [s for s in dict.fromkeys(shas) if HEX.match(s)]
        if not wanted:
            return {}
        proc = _run(["cat-file", "--batch"], cwd=self.path, stdin=("\n".join(wanted) + "\n").encode(), timeout=self.timeout)
        return parse.parse_messages(wanted, proc.stdout)

    def read_paths(self, commit: str, paths: Sequence[str], timeout: float = 300.0) -> dict[str, bytes | None]:
        """Files at `commit` (None: not in the tree). May fetch blobs in a partial clone."""
        if not paths:
            return {}
        stdin = "".join(f"{commit}:{p}\n" for p in paths).encode()
        proc = _run(["cat-file", "--batch"], cwd=self.path, stdin=stdin, timeout=timeout, lazy_fetch=True)
        if proc.returncode != 0:
            raise EnvironmentProblem(problem(f"{self.path}: cannot read files at {commit[:12]}: {parse.last_line(proc.stderr)}"))
        try:
            return parse.parse_blobs(paths, proc.stdout)
        except parse.BatchCut as cut:
            raise EnvironmentProblem(problem(f"{self.path}: git cat-file stopped early at {cut.args[0]}")) from None

    def is_ancestor(self, old: str, new: str) -> bool:
        if not (HEX.match(old) and HEX.match(new)):
            return False
        proc = _run(["merge-base", "--is-ancestor", old, new], cwd=self.path, timeout=self.timeout)
        return proc.returncode == 0

    def has_path(self, commit: str, path: str) -> bool | None:
        """Is `path` in the tree of `commit`? None when trees are not local (treeless clone)."""
        if self.is_partial():
            return None
        out = self._try("cat-file", "-t", f"{commit}:{path}")
        return out is not None

    # -- files that move, and ranges (markers, --discover, kb add) ---------------
    def tree_paths(self, commit: str, timeout: float = 120.0) -> list[str] | None:
        """Every file path at `commit`; None when the tree cannot be read here."""
        proc = _run(["ls-tree", "-r", "-z", "--name-only", commit], cwd=self.path, timeout=timeout, lazy_fetch=True)
        if proc.returncode != 0:
            return None
        return [p for p in proc.stdout.decode("utf-8", "replace").split("\x00") if p]

    def deleted_by(self, commit: str, path: str) -> str | None:
        """The newest commit in `commit`'s history that deleted (or moved away) `path`."""
        out = self._try("log", "--no-mailmap", "-1", "--format=%H", "--diff-filter=D", "--no-renames", commit, "--", path)
        sha = (out or b"").decode().strip()
        return sha or None

    def renamed_in(self, commit: str, path: str) -> str | None:
        """Where git's rename detection says `commit` moved `path` to (None: not a rename)."""
        out = self._try("diff-tree", "-r", "-M", "--no-commit-id", "--name-status", "-z", commit)
        return parse.parse_rename(out or b"", path)

    def range_messages(self, revs: Sequence[str], timeout: float = 300.0) -> list[tuple[str, str, str, list[str]]]:
        """(sha, subject, body, changed paths) of every commit in the range."""
        out = self.git("log", "--no-mailmap", "--no-renames", "--name-only", f"--format={parse.RANGE_FORMAT}", *revs, "--",
                       timeout=timeout, lazy_fetch=True)
        return parse.parse_range(out)

    def range_pickaxe(self, revs: Sequence[str], regex: str, timeout: float = 300.0) -> dict[str, list[tuple[str, str]]]:
        """sha -> [(path, added line)] for commits whose diff adds a line matching `regex` (ERE)."""
        out = self.git("log", "--no-mailmap", "--no-renames", "-p", "-U0", "--no-color", "--no-ext-diff", f"-G{regex}",
                       "--format=%x1e%H", *revs, "--", timeout=timeout, lazy_fetch=True)
        return parse.added_lines(out)

    def patch_of(self, sha: str, limit: int = 4 * 1024 * 1024) -> list[tuple[str, str]]:
        """[(path, added line)] of one commit's diff against its first parent (capped)."""
        out = self.git("show", "--no-mailmap", "--no-renames", "-U0", "--no-color", "--no-ext-diff", "--format=%x1e%H", sha,
                       "--", lazy_fetch=True)
        return next(iter(parse.added_lines(out[:limit]).values()), [])

    def write_commit_graph(self) -> None:
        self._try("commit-graph", "write", "--reachable")

    # -- content: patch-ids and patches applied to a commit's tree ----------------
    def patch_ids(self, shas: Sequence[str], timeout: float = 300.0) -> dict[str, str]:
        """sha -> `git patch-id --stable` of its diff against its first parent, for all
        `shas` in one diff-tree and one patch-id process; "" for a commit with no diff
        (empty, or a merge). May fetch trees and blobs in a partial clone."""
        wanted = [s for s in dict.fromkeys(shas) if HEX.match(s) and len(s) == 40]
        if not wanted:
            return {}
        diff = _run(["diff-tree", "-p", "--no-renames", "--no-color", "--no-ext-diff", "--stdin"], cwd=self.path,
                    stdin=("\n".join(wanted) + "\n").encode(), timeout=timeout, lazy_fetch=True)
        if diff.returncode != 0:
            raise EnvironmentProblem(problem(f"{self.path}: cannot read the diffs of {len(wanted)} commit(s): "
                                             f"{parse.last_line(diff.stderr)}"))
        ids = _run(["patch-id", "--stable"], cwd=self.path, stdin=diff.stdout, timeout=timeout)
        if ids.returncode != 0:
            raise EnvironmentProblem(problem(f"{self.path}: git patch-id failed: {parse.last_line(ids.stderr)}"))
        found = parse.parse_patch_ids(ids.stdout)
        return {sha: found.get(sha, "") for sha in wanted}

    def apply_to(self, commit: str, patches: Sequence[tuple[str, bytes]],
                 timeout: float = 300.0) -> tuple[str, int, str]:
        """Apply `patches` (name, bytes) in order to `commit`'s tree, as `git apply --check`
        then `git apply` do in the build, in a throw-away index (no work tree is touched;
        the patched blobs and trees are written as loose objects, which gc drops).
        Returns (tree of the patched commit, patches applied, why the next one did not).
        Raises EnvironmentProblem when the tree cannot be read here."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="spark-images-apply-") as tmp:
            env_index = str(Path(tmp) / "index")

            def run(args: list[str], stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
                env = _env(True)
                env["GIT_INDEX_FILE"] = env_index
                try:
                    return subprocess.run(["git", *args], cwd=self.path, input=stdin, capture_output=True,
                                          timeout=timeout, env=env, check=False)
                except subprocess.TimeoutExpired:
                    raise EnvironmentProblem(problem(f"git {args[0]} took longer than {timeout:.0f}s in {self.path}")) from None

            read = run(["read-tree", commit])
            if read.returncode != 0:
                raise EnvironmentProblem(problem(f"{self.path}: cannot read the tree of {commit[:12]}: {parse.last_line(read.stderr)}"))
            done, why = 0, ""
            for _name, data in patches:
                check = run(["apply", "--cached", "--check", "-"], data)
                if check.returncode != 0:
                    why = f"git apply --check fails at {commit[:12]}: {parse.last_line(check.stderr)}"
                    break
                applied = run(["apply", "--cached", "-"], data)
                if applied.returncode != 0:
                    why = f"git apply fails at {commit[:12]}: {parse.last_line(applied.stderr)}"
                    break
                done += 1
            tree = run(["write-tree"])
            if tree.returncode != 0:
                raise EnvironmentProblem(problem(f"{self.path}: git write-tree failed: {parse.last_line(tree.stderr)}"))
            return tree.stdout.decode().strip(), done, why


# -- the cached treeless clone of upstream vLLM --------------------------------
def cache_root() -> Path:
    return defaults.history_cache()


def upstream_url() -> str:
    return defaults.vllm_git_url()


def _no_history(url: str, dest: Path, why: str) -> EnvironmentProblem:
    return EnvironmentProblem(
        Problem(
            file=str(dest),
            field="",
            message=f"vLLM history unavailable: cannot fetch {url} ({why})",
            fix=f"pass --repo PATH to a local clone (git clone --bare --filter=tree:0 {url})",
        )
    )


def clone_cache(url: str, dest: Path, timeout: float = 900.0) -> Repo:
    """Make the treeless bare clone (atomically: a half clone never sits at `dest`)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        proc = _run(
            ["-c", "http.lowSpeedLimit=1000", "-c", "http.lowSpeedTime=60",
             "clone", "--bare", "--filter=tree:0", "--quiet", url, str(tmp)],
            timeout=timeout,
            lazy_fetch=True,
        )
    except EnvironmentProblem as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _no_history(url, dest, exc.message) from None
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _no_history(url, dest, parse.last_line(proc.stderr))
    _run(["config", "fetch.writeCommitGraph", "true"], cwd=tmp)
    _run(["commit-graph", "write", "--reachable"], cwd=tmp, timeout=timeout)
    (tmp / _STAMP).write_text(str(time.time()))
    try:
        tmp.rename(dest)
    except OSError:  # another process finished first: use theirs
        shutil.rmtree(tmp, ignore_errors=True)
    return Repo(dest)


def fetch_cache(repo: Repo, url: str, timeout: float = 600.0) -> str | None:
    """Fetch new history into the cache clone; returns why it failed, or None."""
    proc = _run(
        ["-c", "http.lowSpeedLimit=1000", "-c", "http.lowSpeedTime=30",
         "fetch", "--quiet", "--filter=tree:0", "--tags", "--force", url, "+refs/heads/*:refs/heads/*"],
        cwd=repo.path,
        timeout=timeout,
        lazy_fetch=True,
    )
    if proc.returncode != 0:
        return parse.last_line(proc.stderr)
    repo.write_commit_graph()
    (repo.git_dir / _STAMP).write_text(str(time.time()))
    return None


def cache_age_s(repo: Repo) -> float:
    stamp = repo.git_dir / _STAMP
    try:
        return time.time() - stamp.stat().st_mtime
    except OSError:
        return float("inf")


def open_cache(url: str | None = None, dest: Path | None = None) -> tuple[Repo, bool]:
    """The cache clone, cloned on first use. Returns (repo, freshly_cloned)."""
    url = url or upstream_url()
    dest = dest or cache_root() / "vllm.git"
    if (dest / "HEAD").is_file():
        return Repo(dest), False
    return clone_cache(url, dest), True


def no_history_error(url: str, dest: Path, why: str) -> EnvironmentProblem:
    return _no_history(url, dest, why)
