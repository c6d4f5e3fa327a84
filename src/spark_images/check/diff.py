"""What changed between two checked targets (pure: two check documents in, one diff out).

Libraries are matched by their path below site-packages, so the same wheel in
a python3.11 and a python3.12 image is one library. The main and MoE
libraries of vLLM are always listed, changed or not.
"""

from __future__ import annotations

from typing import Any

from spark_images.check.inventory import site_relative
from spark_images.check.rules import MAIN_LIBRARY, MOE_LIBRARY, matches

COUNT_KEYS = ("fatbins", "native", "jit_only", "missing")
ALWAYS = (MAIN_LIBRARY, MOE_LIBRARY)


def _packages(doc: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pkg in doc["inventory"]["packages"]:
        out.setdefault(pkg["name"], pkg["version"])
    return out


def _libraries(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {site_relative(lib["path"]): lib for lib in doc["device_code"]["libraries"]}


def _counts(lib: dict[str, Any] | None) -> dict[str, Any]:
    if lib is None:
        return {"present": False, "verdict": "absent", **{k: 0 for k in COUNT_KEYS}}
    return {"present": True, "verdict": lib.get("verdict", ""), **{k: int(lib.get(k, 0)) for k in COUNT_KEYS}}


def _fix_states(doc: dict[str, Any]) -> dict[int, str] | None:
    fixes = doc.get("fixes") or {}
    if fixes.get("status") not in ("passed", "failed"):
        return None
    return {int(f["pr"]): str(f["state"]) for f in fixes.get("fixes", [])}


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The diff of check documents `a` (before) and `b` (after)."""
    pa, pb = _packages(a), _packages(b)
    packages = {
        "added": [{"name": n, "version": pb[n]} for n in sorted(pb.keys() - pa.keys())],
        "removed": [{"name": n, "version": pa[n]} for n in sorted(pa.keys() - pb.keys())],
        "changed": [{"name": n, "from": pa[n], "to": pb[n]} for n in sorted(pa.keys() & pb.keys()) if pa[n] != pb[n]],
    }
    la, lb = _libraries(a), _libraries(b)
    libraries: list[dict[str, Any]] = []
    for path in sorted(la.keys() | lb.keys()):
        before, after = _counts(la.get(path)), _counts(lb.get(path))
        always = any(matches(p, path) for p in ALWAYS)
        if before == after and not always:
            continue
        change = "unchanged"
        if before["native"] == 0 and after["native"] > 0:
            change = "gained native"
        elif before["native"] > 0 and after["native"] == 0:
            change = "lost native"
        elif before != after:
            change = "changed"
        libraries.append({
            "path": path, "change": change, "before": before, "after": after,
            "native_delta": after["native"] - before["native"],
        })  # fmt: skip
    for pattern in ALWAYS:  # name vLLM's main and MoE libraries even when neither side has them
        if not any(matches(pattern, lib["path"]) for lib in libraries):
            libraries.append({"path": pattern, "change": "absent in both", "before": _counts(None),
                              "after": _counts(None), "native_delta": 0})  # fmt: skip
    fa, fb = _fix_states(a), _fix_states(b)
    if fa is None or fb is None:
        why = [d["target"] for d, f in ((a, fa), (b, fb)) if f is None]
        fixes: dict[str, Any] = {"status": "skipped", "reason": "no fix audit for " + ", ".join(why)}
    else:
        present = {"included", "cherry-picked", "patched", "in-history"}
        have_a = {pr for pr, s in fa.items() if s in present}
        have_b = {pr for pr, s in fb.items() if s in present}
        fixes = {"status": "compared", "gained": sorted(have_b - have_a), "lost": sorted(have_a - have_b)}
    ra = {r["rule"] + ":" + r["subject"]: r for r in a["reasons"]}
    rb = {r["rule"] + ":" + r["subject"]: r for r in b["reasons"]}
    return {
        "a": {"target": a["target"], "verdict": a["verdict"], "digest": a.get("digest")},
        "b": {"target": b["target"], "verdict": b["verdict"], "digest": b.get("digest")},
        "gpu": b["gpu"],
        "packages": packages,
        "libraries": libraries,
        "fixes": fixes,
        "reasons": {
            "new": [rb[k] for k in rb if k not in ra],
            "resolved": [ra[k] for k in ra if k not in rb],
        },
    }


def is_worse(diff: dict[str, Any]) -> bool:
    """B newly fails a rule, loses native code somewhere, or loses a fix."""
    return bool(
        diff["reasons"]["new"]
        or any(lib["change"] == "lost native" for lib in diff["libraries"])
        or diff["fixes"].get("lost")
    )
