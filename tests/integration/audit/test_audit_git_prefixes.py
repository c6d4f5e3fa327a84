"""Many release commit prefixes resolved in one git run, against the one-by-one answer.

Real git on a clone of the vLLM-like history: a commit, a blob made to share the commit's first
four hex digits (so that prefix is ambiguous between a commit and a blob), a
prefix of a tree only, a prefix that names nothing, and a branch whose name is a
hex prefix of another commit (git answers a ref before a short SHA).
"""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path

from spark_images.audit.git import Repo
from support.audit_histories import VllmLike, git


def _blob_sharing(prefix: str) -> bytes:
    """Content whose git blob id starts with `prefix` (4 hex digits: ~65k tries)."""
    for n in itertools.count():
        data = f"{n}\n".encode()
        if hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest().startswith(prefix):
            return data
    raise AssertionError("unreachable")


def test_prefixes_in_one_run_answer_as_one_by_one(vllm_like: VllmLike, tmp_path: Path) -> None:
    repo = tmp_path / "clone.git"
    git(tmp_path, "clone", "-q", "--bare", f"file://{vllm_like.path}", str(repo))
    second, first = git(repo, "rev-list", "-n", "2", "main").split()
    (tmp_path / "twin").write_bytes(_blob_sharing(second[:4]))
    blob = git(repo, "hash-object", "-w", str(tmp_path / "twin")).strip()
    assert blob[:4] == second[:4] and blob != second
    tree = git(repo, "rev-parse", "main^{tree}").strip()
    git(repo, "branch", first[:7], second)  # a branch named like the first commit's prefix, pointing elsewhere
    asked = [second[:12], second[:4], first[:7], first[:9], tree[:10], "0000000", "deadbeefdeadbeef", "not-hex", "ab"]
    found = Repo(repo).commits_with_prefixes(asked)
    expected = {p: Repo(repo).commits_with_prefix(p) for p in asked if p not in ("not-hex", "ab")}
    assert found == expected
    assert found[second[:4]] == [second]  # ambiguous with the blob: the commit is the only commit
    assert found[first[:7]] == [first]  # the branch of that name does not answer for the prefix
    assert found[tree[:10]] == [] and found["0000000"] == []
