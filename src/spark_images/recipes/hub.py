"""A model's headers, from the hub by HTTP range reads or from a local directory (I/O edge; never the weights).

Hub: `{base}/{id}/resolve/{revision}/FILE` (base from `spark_images.defaults.hf_hub()`: SPARK_IMAGES_HF_ENDPOINT, loopback in the tests).
config.json and model.safetensors.index.json are read whole (bounded); each
shard only as `Range: bytes=0-7` (the header length) and then the header
itself. A server that ignores the range (200 with the whole file) is cut off
at once: a fit never downloads weights. A GGUF file is read locally, header only.
Answers that lie are refused with one line naming the file: a header longer
than the file, offsets past it, an index naming a shard that is not there.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from spark_images import defaults
from spark_images.core import inputs
from spark_images.core.errors import EnvironmentProblem, Finding, Problem
from spark_images.recipes import defaults as d
from spark_images.recipes.fit import Weights
from spark_images.recipes.model import Recipe
from spark_images.recipes.weights import (
    HeaderProblem,
    parse_gguf,
    parse_safetensors_header,
    safetensors_header_length,
)
from spark_images.registry import http

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
_SHARD = re.compile(r"[A-Za-z0-9._-]+\.safetensors")
_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")


@dataclass
class ModelFiles:
    weights: Weights
    config: dict[str, Any] | None  # config.json (None for GGUF)
    gguf_metadata: dict[str, Any] | None
    where: str


class _Missing(Exception):
    pass


def _bad(file: str, message: str, fix: str = "use a model whose files are what their headers claim") -> Finding:
    return Finding(Problem(file=file, field="", message=message, fix=fix))


def _unreachable(failure: http.Failure) -> EnvironmentProblem:
    """No answer from the hub (exit 2): the network's or the endpoint's, not the recipe's."""
    fix = f"{failure.fix}; or set {defaults.Env.HF_ENDPOINT}" if failure.fix else f"check the network or {defaults.Env.HF_ENDPOINT}"
    return EnvironmentProblem(Problem(failure.url, "", f"cannot reach the hub: {failure.what}", fix))


def _unreadable(failure: http.Failure) -> Finding:
    """An answer that broke off or ran past its cap: what the hub says cannot be read."""
    return _bad(failure.url, f"its answer is unreadable: {failure.detail()}")


class HubSource:
    """Range reads of one model revision on the hub."""

    def __init__(self, model: str, revision: str) -> None:
        self.base = f"{defaults.hf_hub()}/{model}/resolve/{revision}"
        self.session = requests.Session()

    def url(self, name: str) -> str:
        return f"{self.base}/{name}"

    def _get(self, name: str, headers: dict[str, str], cap: int) -> tuple[requests.Response, bytes]:
        url = self.url(name)
        deadline = http.Deadline(http.meta_deadline_s())
        with http.mapped(url, _unreachable):
            resp = http.send(self.session, "GET", url, deadline=deadline, headers=headers, allow_redirects=True)
        try:
            if resp.status_code == 404:
                raise _Missing(url)
            if "Range" in headers and resp.status_code != 206:
                raise _bad(url, f"answered {resp.status_code} to a range request (it would send the whole file)",
                           "use a hub that honours Range; a fit never downloads weights")
            if resp.status_code not in (200, 206):
                raise EnvironmentProblem(Problem(url, "", f"the hub answered {resp.status_code}", "check the model id and revision"))
            length = http.declared_length(resp)
            if length is not None and length > cap:
                raise _bad(url, f"declares {length} bytes, more than the {cap} a header may take")
            with http.mapped(url, _unreadable, reading=True):
                return resp, http.read_body(resp, deadline=deadline, url=url, cap=cap)
        finally:
            resp.close()

    def json(self, name: str) -> Any:
        _resp, body = self._get(name, {}, d.JSON_LIMIT)
        return inputs.loads_json(body.decode("utf-8", "replace"), file=self.url(name), what=name, error=Finding)

    def ranged(self, name: str, start: int, length: int) -> tuple[bytes, int]:
        """(bytes start..start+length-1, the file's total size from Content-Range)."""
        resp, body = self._get(name, {"Range": f"bytes={start}-{start + length - 1}"}, length)
        m = _RANGE.fullmatch(resp.headers.get("Content-Range", "").strip())
        if not m or int(m.group(1)) != start:
            raise _bad(self.url(name), "answered a range request without a matching Content-Range")
        if len(body) != int(m.group(2)) - start + 1:
            raise _bad(self.url(name), f"sent {len(body)} bytes for a range of {int(m.group(2)) - start + 1}")
        return body, int(m.group(3))


class LocalSource:
    """The same reads from a directory holding the model's files."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def url(self, name: str) -> str:
        return inputs.display_path(self.root / name)

    def json(self, name: str) -> Any:
        path = self.root / name
        if not path.is_file():
            raise _Missing(str(path))
        return inputs.load_json(path, what=name, limit=d.JSON_LIMIT, error=Finding)

    def ranged(self, name: str, start: int, length: int) -> tuple[bytes, int]:
        path = self.root / name
        try:
            with path.open("rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                fh.seek(start)
                return fh.read(length), size
        except FileNotFoundError:
            raise _Missing(str(path)) from None


Source = HubSource | LocalSource


def _shard(source: Source, name: str) -> tuple[int, dict[str, int], int]:
    """(tensor data bytes, bytes per dtype, tensors) of one shard, from its header alone."""
    first, size = source.ranged(name, 0, 8)
    try:
        length = safetensors_header_length(first, size)
        if length > d.SAFETENSORS_HEADER_LIMIT:
            raise HeaderProblem(f"the header claims {length} bytes, over the format's {d.SAFETENSORS_HEADER_LIMIT}")
        header, _ = source.ranged(name, 8, length) if length else (b"", size)
        if len(header) != length:
            raise HeaderProblem(f"the header claims {length} bytes but {len(header)} could be read")
        shard = parse_safetensors_header(header, size)
    except HeaderProblem as exc:
        raise _bad(source.url(name), str(exc)) from None
    return shard.data_bytes, shard.dtypes, shard.tensors


def _safetensors(source: Source) -> Weights:
    try:
        index = source.json(INDEX)
    except _Missing:
        index = None
    if index is None:
        names = [SINGLE]
    else:
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise _bad(source.url(INDEX), "has no weight_map")
        names = sorted({str(v) for v in weight_map.values()})
        bad = [n for n in names if not _SHARD.fullmatch(n)]
        if bad:
            raise _bad(source.url(INDEX), f"names {inputs.short(bad[0], 80)!r}, which is not a shard file name")
    total, detail, tensors = 0, {}, 0
    for name in names:
        try:
            data, dtypes, count = _shard(source, name)
        except _Missing:
            where = f"the index {source.url(INDEX)} names" if index is not None else "no index and no"
            raise _bad(source.url(name), f"{where} shard {name}, which is not there") from None
        total += data
        tensors += count
        for k, v in dtypes.items():
            detail[k] = detail.get(k, 0) + v
    return Weights(bytes=total, source=f"{len(names)} safetensors header(s), {tensors} tensors", files=len(names), detail=detail)


def _gguf(path: Path) -> tuple[Weights, dict[str, Any]]:
    file = inputs.display_path(path)
    try:
        with path.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            data = fh.read(min(size, d.GGUF_HEADER_LIMIT))
    except OSError as exc:
        raise EnvironmentProblem(Problem(file, "", f"cannot read the GGUF file: {exc.strerror}", "check model.gguf")) from None
    try:
        info = parse_gguf(data, size)
    except HeaderProblem as exc:
        raise _bad(file, str(exc)) from None
    weights = Weights(bytes=info.weight_bytes, source=f"GGUF v{info.version} header, {info.tensors} tensors "
                      f"(tensor data section: {size - info.data_start} bytes)", files=1, detail=info.types)
    return weights, info.metadata


def read_model(recipe: Recipe, local: Path | None = None) -> ModelFiles:
    """The weights and config of the recipe's model, from `local` or where the recipe names it."""
    model = recipe.model
    if model.gguf is not None:
        path = local / Path(model.gguf).name if local else Path(model.gguf)
        weights, metadata = _gguf(path)
        return ModelFiles(weights, None, metadata, inputs.display_path(path))
    source: Source
    if local is not None or model.path is not None:
        source = LocalSource(local or Path(model.path or "."))
    else:
        source = HubSource(model.hub or "", model.revision or "main")
    try:
        config = source.json("config.json")
    except _Missing:
        raise _bad(source.url("config.json"), "is not there", "name a model repository with a config.json") from None
    if not isinstance(config, dict):
        raise _bad(source.url("config.json"), "is not a JSON object")
    return ModelFiles(_safetensors(source), config, None, source.url(""))
