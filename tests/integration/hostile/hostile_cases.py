"""Generated misbehaviours, shared by the hostile HTTP, publish and coherence suites.

`BODY_CASES` misbehave on any endpoint; the registry and PyPI suites apply
each one to each endpoint (manifest, index, token, blob, simple page, wheel)
and add the misbehaviours that only make sense on one of them.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servers import Req, Route

from support.oci_blobs import OCI_INDEX, OCI_MANIFEST, digest_of, layer_tar


def lock_entry(repository: str, digest: str, /, **over: Any) -> dict[str, Any]:
    """A well-formed candidate lock entry; `over` replaces fields."""
    doc = {
        "profile": "profiles/cu130.yaml", "image": f"{repository}@{digest}", "repository": repository,
        "digest": digest, "vllm_commit": "98dff2a81" + "0" * 31, "vllm_version": "0.29.0",
        "cuda_version": "13.0.2", "cuda_line": "cu130", "arch_list": "12.0f", "created": "2026-01-02T03:04:05Z",
        "pins": {}, "fixes_included": [], "tags": [], "state": "candidate",
        "cubins": {"verdict": "native", "gpu": "sm_121"}, "audit": {"status": "passed"},
        "coherence": {"status": "skipped", "reason": "no sm_121 GPU (no nvidia-smi)"},
    }  # fmt: skip
    doc.update(over)
    return doc


def passed_combinations(profile: Path, tokens_per_s: float | str = 41.5) -> list[dict[str, Any]]:
    """A passing record's `combinations` for every combination `plan` lists for PROFILE,
    each with its measured median decode speed (or "unknown", as the gate writes it)."""
    from spark_images.buildline.resolve import resolve_profile

    coherence = resolve_profile(profile).plan.coherence
    keys = ("model", "moe_backend", "linear_backend", "kv_cache_dtype")
    return [
        {**dict(zip(keys, combo, strict=True)), "status": "passed", "reasons": [], "warnings": [],
         "speed": {"decode_tokens_per_s": tokens_per_s}}
        for combo in (coherence.combinations if coherence else ())
    ]  # fmt: skip


def _redirect_self(req: Req) -> None:
    req.answer(302, b"", {"Location": req.h.path})


def _redirect_ftp(req: Req) -> None:
    req.answer(302, b"", {"Location": "ftp://127.0.0.1/x"})


def _status(code: int, headers: dict[str, str] | None = None, body: bytes = b"{}") -> Route:
    return lambda req: req.answer(code, body, headers)


# name -> route; every one must end in a clean failure wherever it is served
BODY_CASES: dict[str, Route] = {
    "endless-body": lambda req: req.endless(),
    "endless-body-lying-length": lambda req: req.endless(length=100),
    "huge-content-length": lambda req: req.answer(200, b"{}", length=10**12),
    "slow-drip": lambda req: req.drip(b'{"schemaVersion": 2, "mediaType": "x", "layers": []}' * 4, 1.0),
    "drip-headers": lambda req: req.drip_headers(1.0),
    "never-answers": lambda req: req.hang(),
    "429-retry-after-1800": _status(429, {"Retry-After": "1800"}),
    "429-retry-after-date": _status(429, {"Retry-After": "Fri, 31 Dec 9999 23:59:59 GMT"}),
    "429-no-retry-after": _status(429),
    "503-retry-after-garbage": _status(503, {"Retry-After": "nan"}),
    "500-always": _status(500),
    "redirect-loop": _redirect_self,
    "redirect-ftp": _redirect_ftp,
    "malformed-json": lambda req: req.answer(200, b'{"schemaVersion": 2, "layers": [', None),
    "deep-json": lambda req: req.answer(200, b"[" * 200000 + b"]" * 200000),
    "nan-json": lambda req: req.answer(200, b'{"schemaVersion": NaN, "layers": Infinity}'),
    "json-array": lambda req: req.answer(200, b"[1, 2, 3]"),
    "not-utf8": lambda req: req.answer(200, b'{"a": "\xff\xfe\xfd"}'),
    "empty-200": lambda req: req.answer(200, b""),
    "cut-mid-body": lambda req: req.cut(),
    "html-page": lambda req: req.answer(200, b"<html><body>hello</body></html>", content_type="text/html"),
    "403": _status(403),
    "418": _status(418),
}


class Image:
    """A small well-formed image: one config, one gzip layer with one file."""

    def __init__(self) -> None:
        self.config = b'{"architecture": "arm64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}'
        self.layer = gzip.compress(layer_tar({"usr/lib/hello.txt": b"hello\n"}), 1)
        self.manifest = self.manifest_for(self.layer)

    def manifest_for(self, layer: bytes, size: int | None = None, digest: str | None = None) -> bytes:
        return json.dumps({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": digest_of(self.config), "size": len(self.config)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                        "digest": digest or digest_of(layer), "size": len(layer) if size is None else size}],
        }).encode()  # fmt: skip

    def index_with(self, platform: object) -> bytes:
        return json.dumps({
            "schemaVersion": 2, "mediaType": OCI_INDEX,
            "manifests": [{"mediaType": OCI_MANIFEST, "digest": digest_of(self.manifest),
                           "size": len(self.manifest), "platform": platform}],
        }).encode()  # fmt: skip


def registry_route(image: Image, repo: str, slot: str, bad: Route | None, *, bearer: bool = False) -> Route:
    """A registry for `repo` serving `image`, with endpoint `slot` misbehaving as `bad`.

    Slots: manifest (the tag), token, blob (the layer), config.
    """
    tag_path = f"/v2/{repo}/manifests/v1"
    by_digest = f"/v2/{repo}/manifests/{digest_of(image.manifest)}"
    layer_path = f"/v2/{repo}/blobs/{digest_of(image.layer)}"
    config_path = f"/v2/{repo}/blobs/{digest_of(image.config)}"

    def route(req: Req) -> None:
        if req.path == "/token":
            if slot == "token" and bad is not None:
                return bad(req)
            return req.answer(200, {"token": "good-token"})
        if bearer and req.path.startswith("/v2/") and "Authorization" not in req.headers:
            realm = f"http://{req.server.host}/token"
            return req.answer(401, b"{}", {"WWW-Authenticate": f'Bearer realm="{realm}",service="hostile"'})
        if req.path in (tag_path, by_digest):
            if slot == "manifest" and bad is not None:
                return bad(req)
            return req.answer(200, image.manifest, content_type=OCI_MANIFEST,
                              headers={"Docker-Content-Digest": digest_of(image.manifest)})  # fmt: skip
        if req.path == layer_path:
            if slot == "blob" and bad is not None:
                return bad(req)
            return req.answer(200, image.layer, content_type="application/octet-stream")
        if req.path == config_path:
            if slot == "config" and bad is not None:
                return bad(req)
            return req.answer(200, image.config, content_type="application/octet-stream")
        return req.answer(404, b'{"errors": [{"code": "NOT_FOUND"}]}')

    return route


def token_cases() -> dict[str, Route]:
    """Token endpoint answers that must each be one named problem."""
    def token(value: object) -> Route:
        return lambda req: req.answer(200, {"token": value})

    return {
        "token-not-latin1": token("t\u0101\u4e00ken"),
        "token-with-newline": token("abc\r\nX-Injected: 1"),
        "token-with-space": token("abc def"),
        "token-number": token(12345),
        "token-list": token(["a", "b"]),
        "token-empty": token(""),
        "token-huge": token("a" * (80 * 1024)),
        "token-401": _status(401),
    }


def manifest_cases(image: Image) -> dict[str, Route]:
    """Manifests and indexes that are JSON but not what the API promises."""
    def doc(body: bytes, media: str = OCI_MANIFEST) -> Route:
        return lambda req: req.answer(200, body, content_type=media)

    def index(platform: object) -> Route:
        return doc(image.index_with(platform), OCI_INDEX)

    return {
        "index-platform-string": index("linux/arm64"),
        "index-platform-list": index(["linux", "arm64"]),
        "index-platform-null-only": index(None),
        "index-manifests-not-list": doc(b'{"schemaVersion": 2, "mediaType": "%s", "manifests": "all"}' % OCI_INDEX.encode(), OCI_INDEX),
        "index-manifests-strings": doc(b'{"schemaVersion": 2, "mediaType": "%s", "manifests": ["a", "b"]}' % OCI_INDEX.encode(), OCI_INDEX),
        "index-annotations-string": doc(json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
            {"digest": digest_of(image.manifest), "size": 1, "annotations": "x", "platform": {"os": "linux", "architecture": "arm64"}}]}).encode(), OCI_INDEX),
        "index-no-arm64": index({"os": "linux", "architecture": "amd64"}),
        "manifest-layers-string": doc(b'{"schemaVersion": 2, "mediaType": "%s", "config": {"digest": "sha256:%s", "size": 2}, "layers": "x"}' % (OCI_MANIFEST.encode(), b"0" * 64)),
        "manifest-layer-negative-size": doc(image.manifest_for(image.layer, size=-1)),
        "manifest-layer-bad-digest": doc(image.manifest_for(image.layer, digest="sha256:xyz\n")),
        "manifest-config-missing": doc(json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "layers": []}).encode()),
        "manifest-media-type-number": doc(json.dumps({"schemaVersion": 2, "mediaType": 7, "layers": []}).encode()),
    }


def blob_cases(image: Image) -> dict[str, Route]:
    """Layer downloads that lie about their bytes."""
    return {
        "blob-wrong-bytes": lambda req: req.answer(200, b"x" * len(image.layer), content_type="application/octet-stream"),
        "blob-longer-than-declared": lambda req: req.answer(200, image.layer + b"extra" * 1000),
        "blob-endless": lambda req: req.endless(piece=b"\0" * 65536),
        "blob-shorter-then-eof": lambda req: req.answer(200, image.layer[:10]),
        "blob-drip": lambda req: req.drip(image.layer, 1.0),
    }


Case = tuple[str, str, Route]  # (id, slot, route)


def registry_cases(image: Image) -> list[Case]:
    cases: list[Case] = []
    for slot in ("manifest", "token", "blob"):
        cases += [(f"{slot}-{name}", slot, route) for name, route in BODY_CASES.items()]
    cases += [(name, "token", route) for name, route in token_cases().items()]
    cases += [(name, "manifest", route) for name, route in manifest_cases(image).items()]
    cases += [(name, "blob", route) for name, route in blob_cases(image).items()]
    return cases


Pick = Callable[[Req], None]
