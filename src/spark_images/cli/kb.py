"""`spark-images kb`: the fixes knowledge base as data.

  kb add PR [--repo PATH]        draft a fixes.yaml entry for PR (title, area,
                                 marker candidates from its diff), for review;
                                 prints YAML (or --json); changes no file
  kb export --format osv         every entry as an OSV-style JSON record:
        [--repo PATH] [--output FILE]
                                 affected package vllm, GIT ranges with
                                 introduced/fixed on vllm-project/vllm, our
                                 fields under database_specific; `modified` is
                                 each entry's own date, so two exports of one
                                 knowledge base are byte-identical; --repo checks
                                 that every main commit is in that clone

--kb FILE reads another knowledge base instead of the shipped one. History:
--repo PATH, else the cached clone (see `spark-images audit --help`).
Exit 1 when `kb add` names a PR already in the knowledge base; 2 for usage
or environment problems.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

from spark_images.cli._common import add_json_flag, emit
from spark_images.core import atomic
from spark_images.core.errors import EXIT_OK, Finding, Problem, UsageError


def _pr(text: str) -> int:
    value = text.strip().lstrip("#")
    if not value.isdigit() or not 0 < int(value) < 10**8:
        raise argparse.ArgumentTypeError(f"{text!r} is not a PR number (e.g. 40082 or #40082)")
    return int(value)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("kb", help="draft knowledge-base entries; export the knowledge base as OSV records",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    inner = parser.add_subparsers(dest="kb_command", metavar="ACTION")
    inner.required = True
    add = inner.add_parser("add", help="draft a fixes.yaml entry for a merged PR")
    add.add_argument("pr", type=_pr, metavar="PR")
    add.add_argument("--repo", type=Path, metavar="PATH", help="a local vLLM clone (default: the cached clone)")
    add.add_argument("--kb", type=Path, metavar="FILE", help="knowledge base to compare with (default: the shipped one)")
    add_json_flag(add)
    add.set_defaults(handler=run_add)
    export = inner.add_parser("export", help="the knowledge base as OSV-style JSON")
    export.add_argument("--format", choices=("osv",), required=True)
    export.add_argument("--repo", type=Path, metavar="PATH", help="check that every main commit is in this clone")
    export.add_argument("--kb", type=Path, metavar="FILE", help="knowledge base to export (default: the shipped one)")
    export.add_argument("--output", type=Path, metavar="FILE", help="write the JSON here (atomically) instead of stdout")
    export.set_defaults(handler=run_export, json=True)


def run_add(args: argparse.Namespace) -> int:
    from spark_images.audit import Auditor, load_knowledge, open_history
    from spark_images.audit.kb_tools import draft_entry

    kb = load_knowledge(args.kb)
    if kb.get(args.pr) is not None:
        raise Finding(Problem(str(args.kb or "fixes.yaml"), f"#{args.pr}", "already in the knowledge base",
                              "edit its entry instead"))
    auditor = Auditor(open_history(args.repo), kb)
    index = auditor.index()
    shas = index.by_pr.get(args.pr, [])
    if not shas:
        raise UsageError(Problem(str(auditor.repo.path), "", f"no commit with a (#{args.pr}) subject in this history",
                                 "check the number (issues are not PRs), or fetch newer history"))
    sha = next((s for s in shas if s in index.reach), shas[0])  # the squash on main before a cherry-pick
    subject, body = auditor.repo.messages([sha]).get(sha, (index.commits[sha].subject, ""))
    ids, _why = auditor.patch_ids.of([sha])
    merged = index.commits[sha].time if sha in index.commits else 0
    draft = draft_entry(args.pr, sha, subject, body, auditor.repo.patch_of(sha),
                        patch_id=(ids or {}).get(sha, ""), merged=merged)
    draft["commit"] = sha
    text = (
        f"# draft for #{args.pr} from {sha[:12]}: review every field before adding it to fixes.yaml\n"
        + (f"# evidence: {draft['evidence']}\n" if draft["evidence"] else "")
        + yaml.safe_dump([draft["entry"]], sort_keys=False, allow_unicode=True, width=120)
    )
    emit(args, draft, text)
    return EXIT_OK


def run_export(args: argparse.Namespace) -> int:
    from spark_images.audit import load_knowledge
    from spark_images.audit.kb_tools import osv_records

    kb = load_knowledge(args.kb)
    where = str(args.kb or "fixes.yaml")
    if args.repo is not None:
        from spark_images.audit.git import Repo

        repo = Repo(args.repo)
        missing = [Problem(where, f"#{f.pr}.main_commit", f"{f.main_commit} is not in {args.repo}",
                           "fetch newer history into that clone, or correct the entry")
                   for f in kb.fixes if f.main_commit and repo.resolve_commit(f.main_commit) != f.main_commit]
        if missing:
            raise Finding(*missing)
    records: list[dict[str, Any]] = osv_records(kb, file=where)
    text = json.dumps(records, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    if args.output is not None:
        atomic.write_text(args.output, text)
        print(f"wrote {len(records)} OSV records to {args.output}")
    else:
        emit(args, records, text)
    return EXIT_OK
