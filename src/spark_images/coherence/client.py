"""An OpenAI-API client for a vLLM server, with stream timing (I/O only).

Every request is greedy (temperature 0) with a fixed seed, so two runs on a
healthy server give the same tokens. Chat requests switch thinking off
(`chat_template_kwargs: {"enable_thinking": false}`): a reasoning model would
otherwise spend the whole token budget thinking and answer nothing; templates
without that switch ignore it. Errors become `ServerError` with one readable
line, never a `requests` traceback.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import requests

from spark_images.core.inputs import json_depth_exceeds
from spark_images.registry import http

JSON_CAP = 4 * http.MiB  # one completion with logprobs is a few KiB
STREAM_CAP = 16 * http.MiB  # a streamed answer of a few hundred tokens is ~100 KiB
METRICS_CAP = 8 * http.MiB


class ServerError(Exception):
    """The server did not answer as the OpenAI API says (HTTP error, refused, bad JSON).

    `timed_out` is set when the request ran past its overall deadline: the
    gate then stops asking a server that does not answer.
    """

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


def _usage_tokens(doc: dict[str, Any], where: str) -> object:
    """`usage.completion_tokens` as the server sent it (judged by the caller), or None.

    A `usage` that is there but not an object is a malformed answer.
    """
    usage = doc.get("usage")
    if usage is None:
        return None
    if not isinstance(usage, dict):
        raise ServerError(f"{where}: `usage` is a {type(usage).__name__}, not an object")
    return usage.get("completion_tokens")


@dataclass(frozen=True)
class HealthAnswer:
    """One GET /health: its status, or None, and what was seen, in words."""

    status: int | None
    seen: str
    connected: bool = False  # something accepted the connection
    no_host: bool = False  # the host name does not resolve: no wait will fix that


@dataclass
class Completion:
    text: str
    finish_reason: str | None = None
    completion_tokens: object = None  # as reported: speed.token_count judges it
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
    completion_tokens: object = None  # as reported: speed.token_count judges it
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

    def _deadline(self, timeout_s: float | None = None) -> http.Deadline:
        return http.Deadline(timeout_s or self.timeout_s)

    def _send(self, method: str, path: str, deadline: http.Deadline, **kwargs: Any) -> requests.Response:
        url = self._url(path)
        try:
            return http.send(self.session, method, url, deadline=deadline, **kwargs)
        except http.TRANSPORT_ERRORS as exc:
            raise _server_error(http.failure(exc, url), method) from None

    def _read(self, resp: requests.Response, path: str, deadline: http.Deadline, cap: int) -> bytes:
        url = self._url(path)
        try:
            return http.read_body(resp, deadline=deadline, url=url, cap=cap)
        except http.TRANSPORT_ERRORS as exc:
            raise _server_error(http.failure(exc, url, reading=True)) from None

    def _post(self, path: str, body: dict[str, Any], *, stream: bool = False) -> tuple[requests.Response, http.Deadline]:
        deadline = self._deadline()
        resp = self._send("POST", path, deadline, json=body, timeout=deadline.timeout())
        if resp.status_code != 200:
            detail = http.error_text(resp, deadline, self._url(path))
            raise ServerError(f"POST {self._url(path)}: HTTP {resp.status_code}" + (f": {detail}" if detail else ""))
        return resp, deadline

    def _get(self, path: str, timeout_s: float | None = None, cap: int = JSON_CAP) -> tuple[int, bytes]:
        deadline = self._deadline(timeout_s)
        resp = self._send("GET", path, deadline, timeout=deadline.timeout())
        return resp.status_code, self._read(resp, path, deadline, cap)

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
        """HTTP status of /health, or None when nothing answers (in time)."""
        return self.health_answer(timeout_s).status

    def health_answer(self, timeout_s: float = 5.0) -> HealthAnswer:
        """What GET /health got: a status, or why there was none, in words.

        Real vLLM keeps its port closed for the whole model load (minutes), so
        a refused connection is "not up yet", and the caller decides how long
        to wait for it.
        """
        deadline = self._deadline(timeout_s)
        url = self._url("/health")
        try:
            resp = http.send(self.session, "GET", url, deadline=deadline, timeout=deadline.timeout())
        except http.TRANSPORT_ERRORS as exc:
            failure = http.failure(exc, url)
            if failure.kind == "dns":
                return HealthAnswer(None, "no such host", no_host=True)
            if failure.kind == "refused":
                return HealthAnswer(None, "connection refused")
            if not failure.connected:
                return HealthAnswer(None, f"no connection ({failure.cause})", connected=False)
            if failure.timed_out:
                return HealthAnswer(None, f"no answer within {timeout_s:g} s", connected=True)
            return HealthAnswer(None, f"broken answer ({failure.cause})", connected=True)
        resp.close()
        return HealthAnswer(resp.status_code, f"HTTP {resp.status_code}", connected=True)

    def models(self) -> list[str]:
        status, body = self._get("/v1/models", 30)
        where = f"GET {self._url('/v1/models')}"
        if status != 200:
            raise ServerError(f"{where}: HTTP {status}")
        doc = self._parse(body, where)
        data = doc.get("data")
        if not isinstance(data, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in data):
            raise ServerError(f"{where}: `data` is not a list of models with string ids")
        return [str(m["id"])[:200] for m in data]

    def metrics(self) -> str:
        status, body = self._get("/metrics", 30, cap=METRICS_CAP)
        if status != 200:
            raise ServerError(f"GET {self._url('/metrics')}: HTTP {status}")
        return body.decode("utf-8", errors="replace")

    def complete(
        self, prompt: str, max_tokens: int, *, logprobs: int | None = None, ignore_eos: bool = False
    ) -> Completion:
        body = self._sampling(max_tokens, ignore_eos=ignore_eos)
        body["prompt"] = prompt
        if logprobs is not None:
            body["logprobs"] = logprobs
        doc = self._json("/v1/completions", body)
        try:
            choice = doc["choices"][0]
            out = Completion(
                text=choice.get("text") or "",
                finish_reason=choice.get("finish_reason"),
                completion_tokens=_usage_tokens(doc, self._url("/v1/completions")),
            )
            lp = choice.get("logprobs")
            if lp:
                out.tokens = list(lp.get("tokens") or [])
                out.top_logprobs = [dict(t or {}) for t in lp.get("top_logprobs") or []]
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
            raise ServerError(f"{self._url('/v1/completions')}: unexpected answer {_excerpt(doc)}") from exc
        return _checked(out, self._url("/v1/completions"))

    def chat(self, message: str, max_tokens: int, *, top_logprobs: int | None = None) -> Completion:
        body = self._chat_body(message, max_tokens)
        if top_logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = top_logprobs
        doc = self._json("/v1/chat/completions", body)
        try:
            choice = doc["choices"][0]
            msg = choice.get("message") or {}
            out = Completion(
                text=msg.get("content") or "",
                finish_reason=choice.get("finish_reason"),
                completion_tokens=_usage_tokens(doc, self._url("/v1/chat/completions")),
                reasoning=msg.get("reasoning_content") or msg.get("reasoning"),
            )
            lp = choice.get("logprobs")
            if lp and lp.get("content") is not None:
                out.tokens = [c["token"] for c in lp["content"]]
                out.top_logprobs = [
                    {t["token"]: t["logprob"] for t in c.get("top_logprobs") or []} for c in lp["content"]
                ]
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
            raise ServerError(f"{self._url('/v1/chat/completions')}: unexpected answer {_excerpt(doc)}") from exc
        return _checked(out, self._url("/v1/chat/completions"))

    def stream_complete(self, prompt: str, max_tokens: int, *, ignore_eos: bool = False) -> StreamResult:
        body = self._sampling(max_tokens, ignore_eos=ignore_eos)
        body.update(prompt=prompt, stream=True, stream_options={"include_usage": True})
        return self._stream("/v1/completions", body, chat=False)

    def stream_chat(self, message: str, max_tokens: int) -> StreamResult:
        body = self._chat_body(message, max_tokens)
        body.update(stream=True, stream_options={"include_usage": True})
        return self._stream("/v1/chat/completions", body, chat=True)

    # --- helpers ----------------------------------------------------------------------

    def _json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        resp, deadline = self._post(path, body)
        return self._parse(self._read(resp, path, deadline, JSON_CAP), f"POST {self._url(path)}")

    @staticmethod
    def _parse(data: bytes, where: str) -> dict[str, Any]:
        text = data.decode("utf-8", errors="replace")
        if json_depth_exceeds(text):
            raise ServerError(f"{where}: the answer nests too deeply")
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError):
            raise ServerError(f"{where}: answer is not JSON: {text[:200]!r}") from None
        if not isinstance(doc, dict):
            raise ServerError(f"{where}: answer is not a JSON object")
        return doc

    def _stream(self, path: str, body: dict[str, Any], *, chat: bool) -> StreamResult:
        result = StreamResult(t_sent=time.monotonic())
        url = self._url(path)
        resp, deadline = self._post(path, body, stream=True)
        # chunk=None: hand over each HTTP chunk as it arrives (one SSE event each on
        # vLLM), so arrival times are token times, not buffer-fill times.
        pieces = http.iter_body(resp, deadline=deadline, url=url, cap=STREAM_CAP, chunk=None)
        try:
            for when, data in iter_sse(pieces):
                if data == "[DONE]":
                    result.done = True
                    break
                doc = self._parse(data.encode("utf-8"), f"{url} stream event")
                if doc.get("usage") is not None:
                    result.completion_tokens = _usage_tokens(doc, f"{url} stream event")
                choices = doc.get("choices") or []
                if not isinstance(choices, list):
                    raise ServerError(f"{url}: stream event `choices` is not a list")
                for choice in choices:
                    if not isinstance(choice, dict):
                        raise ServerError(f"{url}: stream event choice is not an object")
                    delta = choice.get("delta") if chat else None
                    piece = (delta.get("content") if isinstance(delta, dict) else None) if chat else choice.get("text")
                    if isinstance(piece, str) and piece:
                        result.pieces.append(piece)
                        result.times.append(when)
                    if isinstance(choice.get("finish_reason"), str):
                        result.finish_reason = choice["finish_reason"]
        except http.TRANSPORT_ERRORS as exc:
            raise _server_error(http.failure(exc, url, reading=True), "stream") from None
        finally:
            # the body's own close: it stops its reading thread, then closes the response. Closing
            # the response here instead, after a break at [DONE], raced that thread's last read
            # (ValueError "I/O operation on closed file" from http.client's flush). A body never
            # started has no thread and no close of its own, so the response is closed here
            never_started = inspect.getgeneratorstate(pieces) == inspect.GEN_CREATED
            pieces.close()
            if never_started:
                resp.close()
        result.text = "".join(result.pieces)
        return result


def _server_error(failure: http.Failure, what: str = "") -> ServerError:
    """ServerError from the shared words for a failed exchange ("METHOD URL: what (fix: ...)")."""
    where = f"{what} {http.short_url(failure.url)}" if what else http.short_url(failure.url)
    return ServerError(f"{where}: {failure.detail()}", timed_out=failure.timed_out)


def _checked(out: Completion, where: str) -> Completion:
    """The answer's fields have the types the API gives them, or ServerError naming the field."""
    if not isinstance(out.text, str):
        raise ServerError(f"{where}: the answer's text is a {type(out.text).__name__}, not a string")
    if out.finish_reason is not None and not isinstance(out.finish_reason, str):
        raise ServerError(f"{where}: finish_reason is not a string")
    if out.reasoning is not None and not isinstance(out.reasoning, str):
        out.reasoning = None
    if out.tokens is not None and not all(isinstance(t, str) for t in out.tokens):
        raise ServerError(f"{where}: logprobs tokens are not all strings")
    if out.top_logprobs is not None and not all(
        isinstance(top, dict) and all(isinstance(k, str) for k in top) for top in out.top_logprobs
    ):
        raise ServerError(f"{where}: top_logprobs are not objects of token -> logprob")
    return out


def _excerpt(doc: object) -> str:
    try:
        return json.dumps(doc)[:200]
    except (TypeError, ValueError, RecursionError):
        return repr(type(doc))
