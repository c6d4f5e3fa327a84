"""An OpenAI-API client for a vLLM server, with stream timing (I/O only).

Every request is greedy (temperature 0) with a fixed seed, so two runs on a
healthy server give the same tokens. Chat requests switch thinking off
(`chat_template_kwargs: {"enable_thinking": false}`): a reasoning model would
otherwise spend the whole token budget thinking and answer nothing; templates
without that switch ignore it. Errors become `ServerError` with one readable
line, never a `requests` traceback.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import requests


class ServerError(Exception):
    """The server did not answer as the OpenAI API says (HTTP error, refused, bad JSON)."""


@dataclass
class Completion:
    text: str
    finish_reason: str | None = None
    completion_tokens: int | None = None
    tokens: list[str] | None = None  # with logprobs
    top_logprobs: list[dict[str, float]] | None = None
    reasoning: str | None = None


@dataclass
class StreamResult:
    text: str = ""
    pieces: list[str] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # monotonic arrival of each content piece
    t_sent: float = 0.0
    finish_reason: str | None = None
    completion_tokens: int | None = None
    done: bool = False  # saw `data: [DONE]`


def iter_sse(chunks: Iterator[bytes]) -> Iterator[tuple[float, str]]:
    """(arrival time, data payload) for each `data: ` event of a byte stream."""
    buffer = b""
    for chunk in chunks:
        now = time.monotonic()
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            line = line.rstrip(b"\r")
            if line.startswith(b"data:"):
                yield now, line[5:].strip().decode("utf-8", errors="replace")
    if buffer.strip().startswith(b"data:"):
        yield time.monotonic(), buffer.strip()[5:].strip().decode("utf-8", errors="replace")


class OpenAIClient:
    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        seed: int = 1234,
        timeout_s: float = 300.0,
        thinking_off: bool = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.seed = seed
        self.timeout_s = timeout_s
        self.thinking_off = thinking_off
        self.session = requests.Session()
        # A proxy must never sit between us and a server on loopback (HTTP(S)_PROXY is often
        # set without a NO_PROXY for 127.0.0.1); a remote --endpoint may need one.
        host = urlsplit(self.base_url).hostname or ""
        self.session.trust_env = host not in ("127.0.0.1", "localhost", "::1")

    # --- plumbing ---------------------------------------------------------------------

    def _url(self, path: str) -> str:
        return f"{self.base_url}{path}"

    def _post(self, path: str, body: dict[str, Any], *, stream: bool = False) -> requests.Response:
        try:
            resp = self.session.post(self._url(path), json=body, timeout=self.timeout_s, stream=stream)
        except requests.RequestException as exc:
            raise ServerError(f"POST {path}: {exc.__class__.__name__}: {exc}") from exc
        if resp.status_code != 200:
            raise ServerError(f"POST {path}: HTTP {resp.status_code}: {resp.text[:300]}")
        return resp

    def _get(self, path: str, timeout_s: float | None = None) -> requests.Response:
        try:
            return self.session.get(self._url(path), timeout=timeout_s or self.timeout_s)
        except requests.RequestException as exc:
            raise ServerError(f"GET {path}: {exc.__class__.__name__}: {exc}") from exc

    def _sampling(self, max_tokens: int, *, ignore_eos: bool = False) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "seed": self.seed,
        }
        if ignore_eos:
            body["ignore_eos"] = True  # vLLM's extra sampling parameter
        return body

    def _chat_body(self, message: str, max_tokens: int) -> dict[str, Any]:
        body = self._sampling(max_tokens)
        body["messages"] = [{"role": "user", "content": message}]
        if self.thinking_off:
            body["chat_template_kwargs"] = {"enable_thinking": False}
        return body

    # --- endpoints --------------------------------------------------------------------

    def health(self, timeout_s: float = 5.0) -> int | None:
        """HTTP status of /health, or None when nothing answers yet."""
        try:
            return self.session.get(self._url("/health"), timeout=timeout_s).status_code
        except requests.RequestException:
            return None

    def connection_refused(self, timeout_s: float = 5.0) -> str | None:
        """Why no connection can be made at all (refused, no such host), or None.

        A vLLM server opens its port before it loads the model, so a refused
        connection means nothing is there, not a server still starting.
        """
        try:
            self.session.get(self._url("/health"), timeout=timeout_s)
        except requests.ConnectionError as exc:
            text = str(exc).lower()
            if "name or service not known" in text or "nodename nor servname" in text or "failed to resolve" in text:
                return "no such host"
            return "connection refused"
        except requests.RequestException:
            return None
        return None

    def models(self) -> list[str]:
        resp = self._get("/v1/models", 30)
        try:
            return [str(m["id"]) for m in resp.json()["data"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise ServerError(f"GET /v1/models: unexpected answer {resp.text[:200]!r}") from exc

    def metrics(self) -> str:
        resp = self._get("/metrics", 30)
        if resp.status_code != 200:
            raise ServerError(f"GET /metrics: HTTP {resp.status_code}")
        return resp.text

    def complete(
        self, prompt: str, max_tokens: int, *, logprobs: int | None = None, ignore_eos: bool = False
    ) -> Completion:
        body = self._sampling(max_tokens, ignore_eos=ignore_eos)
        body["prompt"] = prompt
        if logprobs is not None:
            body["logprobs"] = logprobs
        doc = self._json(self._post("/v1/completions", body), "/v1/completions")
        try:
            choice = doc["choices"][0]
            out = Completion(
                text=choice.get("text") or "",
                finish_reason=choice.get("finish_reason"),
                completion_tokens=(doc.get("usage") or {}).get("completion_tokens"),
            )
            lp = choice.get("logprobs")
            if lp:
                out.tokens = list(lp.get("tokens") or [])
                out.top_logprobs = [dict(t or {}) for t in lp.get("top_logprobs") or []]
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ServerError(f"/v1/completions: unexpected answer {json.dumps(doc)[:200]}") from exc
        return out

    def chat(self, message: str, max_tokens: int, *, top_logprobs: int | None = None) -> Completion:
        body = self._chat_body(message, max_tokens)
        if top_logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = top_logprobs
        doc = self._json(self._post("/v1/chat/completions", body), "/v1/chat/completions")
        try:
            choice = doc["choices"][0]
            msg = choice.get("message") or {}
            out = Completion(
                text=msg.get("content") or "",
                finish_reason=choice.get("finish_reason"),
                completion_tokens=(doc.get("usage") or {}).get("completion_tokens"),
                reasoning=msg.get("reasoning_content") or msg.get("reasoning"),
            )
            lp = choice.get("logprobs")
            if lp and lp.get("content") is not None:
                out.tokens = [c["token"] for c in lp["content"]]
                out.top_logprobs = [
                    {t["token"]: t["logprob"] for t in c.get("top_logprobs") or []} for c in lp["content"]
                ]
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ServerError(f"/v1/chat/completions: unexpected answer {json.dumps(doc)[:200]}") from exc
        return out

    def stream_complete(self, prompt: str, max_tokens: int, *, ignore_eos: bool = False) -> StreamResult:
        body = self._sampling(max_tokens, ignore_eos=ignore_eos)
        body.update(prompt=prompt, stream=True, stream_options={"include_usage": True})
        return self._stream("/v1/completions", body, chat=False)

    def stream_chat(self, message: str, max_tokens: int) -> StreamResult:
        body = self._chat_body(message, max_tokens)
        body.update(stream=True, stream_options={"include_usage": True})
        return self._stream("/v1/chat/completions", body, chat=True)

    # --- helpers ----------------------------------------------------------------------

    @staticmethod
    def _json(resp: requests.Response, path: str) -> dict[str, Any]:
        try:
            doc = resp.json()
        except ValueError as exc:
            raise ServerError(f"{path}: answer is not JSON: {resp.text[:200]!r}") from exc
        if not isinstance(doc, dict):
            raise ServerError(f"{path}: answer is not a JSON object")
        return doc

    def _stream(self, path: str, body: dict[str, Any], *, chat: bool) -> StreamResult:
        result = StreamResult(t_sent=time.monotonic())
        resp = self._post(path, body, stream=True)
        try:
            # chunk_size=None: hand over each HTTP chunk as it arrives (one SSE event each on
            # vLLM), so arrival times are token times, not buffer-fill times.
            for when, data in iter_sse(resp.iter_content(chunk_size=None)):
                if data == "[DONE]":
                    result.done = True
                    break
                try:
                    doc = json.loads(data)
                except ValueError as exc:
                    raise ServerError(f"{path}: stream event is not JSON: {data[:120]!r}") from exc
                if doc.get("usage"):
                    result.completion_tokens = doc["usage"].get("completion_tokens")
                for choice in doc.get("choices") or []:
                    piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                    if piece:
                        result.pieces.append(piece)
                        result.times.append(when)
                    if choice.get("finish_reason"):
                        result.finish_reason = choice["finish_reason"]
        except requests.RequestException as exc:
            raise ServerError(f"{path}: stream broke: {exc.__class__.__name__}: {exc}") from exc
        finally:
            resp.close()
        result.text = "".join(result.pieces)
        return result
