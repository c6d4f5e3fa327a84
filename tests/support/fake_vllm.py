#!/usr/bin/env python3
"""A stand-in for `vllm serve` on a DGX Spark (GB10, sm_121), for tests only.

The real server cannot run here (no Spark GPU), so this one behaves like it
where the coherence gate looks: the OpenAI API as vLLM serves it
(`/v1/completions`, `/v1/chat/completions` with SSE `data: ` chunks, `usage`
and `[DONE]`; `/v1/models`; `/health` answering nothing, then 503, then 200
while the engine starts; `/metrics` in Prometheus text with
`vllm:generation_tokens_total` and the inter-token latency histogram), log
lines in vLLM's format (including `Using 'X' NvFp4 MoE backend out of
potential backends` and `Using <Kernel> for NVFP4 GEMM`, so backend parsing
is exercised), realistic per-token delays so tok/s is measurable, and the
failure modes reported from real Sparks: fatal start-up lines and a non-zero
exit, and the silent garbage patterns served with HTTP 200.

Python standard library only: it also runs as the `vllm` entrypoint of a
minimal arm64 Debian image that has nothing but python3.

    python3 fake_vllm.py serve MODEL --port 8000 [any vLLM flag ...] [--fake-mode MODE]

MODE (flag or env FAKE_VLLM_MODE) is one behaviour, or a per-backend map keyed
by the requested `--moe-backend`: `flashinfer_b12x=loop,marlin=coherent,*=crash-nvfp4`.
Behaviours: coherent, wrong, loop, apostrophe, bang, empty, short, special,
tagloop, soup, concurrency-bang, degraded-marlin, mismatch, hang, crash-nvfp4,
crash-cutlass-fp4, crash-no-kernel, crash-ptxas, crash-fp8-cutlass,
crash-concurrency, crash-exit.
Like real vLLM 0.26 (recorded), an unknown --moe-backend exits 2 with argparse's
line and vLLM's choices, and a --max-model-len above 8192 exits 1 with vLLM's
config refusal. FAKE_VLLM_LOAD_S=N keeps the port closed for N s, then answers
/health 200 at once, as real vLLM does through a model load.
Other knobs (env): FAKE_VLLM_TOKS_PER_S (number or per-backend map; `100/300`
is 100 tok/s on a backend's first start and 300 on its second, counted in
FAKE_VLLM_START_LOG, the file each start appends its backends to),
FAKE_VLLM_STARTUP_S (default 3), FAKE_VLLM_REASONING=1 (a reasoning model:
thinks unless `chat_template_kwargs.enable_thinking` is false),
FAKE_VLLM_NO_CHAT_TEMPLATE=1 (a base model: chat requests answer 400, as vLLM
does when the tokenizer defines no chat template).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VERSION = "0.29.0"
API_PID = os.getpid()
CORE_PID = API_PID + 36

GARBAGE_MODES = (
    "loop", "apostrophe", "bang", "empty", "short", "special", "tagloop", "soup",
)  # fmt: skip
CRASH_LINES = {
    "crash-nvfp4": "NotImplementedError: No compiled nvfp4 mm kernel for SM 121. Recompile vLLM "
    "with CUDA >= 12.8 and an arch list that includes 12.0a/12.1a or 12.0f.",
    "crash-cutlass-fp4": "RuntimeError: Failed to run cutlass FP4 gemm on sm120. Error: Error Internal",
    "crash-no-kernel": "torch.AcceleratorError: CUDA error: no kernel image is available for "
    "execution on the device",
    "crash-ptxas": "ptxas fatal   : Value 'sm_121a' is not defined for option 'gpu-name'",
    "crash-fp8-cutlass": "RuntimeError: [cutlass_gemm_caller.cuh:62] cutlass_gemm_caller "
    "failed: Error Internal",
}
REMOVED_ENV = ("VLLM_NVFP4_GEMM_BACKEND", "VLLM_USE_FLASHINFER_MOE_FP4", "VLLM_FLASHINFER_MOE_BACKEND")
DEFAULT_TOKS = {"auto": 60.0, "flashinfer_b12x": 75.0, "b12x": 75.0, "marlin": 50.0, "cutlass": 40.0}
MOE_ENUM = {
    "auto": "FLASHINFER_CUTLASS", "flashinfer_b12x": "FLASHINFER_B12X", "b12x": "B12X",
    "marlin": "MARLIN", "cutlass": "VLLM_CUTLASS", "flashinfer_cutlass": "FLASHINFER_CUTLASS",
    "triton": "TRITON", "flashinfer_trtllm": "FLASHINFER_TRTLLM",
}  # fmt: skip
LINEAR_KERNEL = {
    "auto": "FlashInferCutlassNvFp4LinearKernel", "flashinfer_b12x": "FlashInferB12xNvFp4LinearKernel",
    "b12x": "B12xNvFp4LinearKernel", "marlin": "MarlinNvFp4LinearKernel",
    "cutlass": "CutlassNvFp4LinearKernel", "flashinfer_cutlass": "FlashInferCutlassNvFp4LinearKernel",
}  # fmt: skip

FLUENT = (
    "A bicycle turns the push of your legs into forward motion.",
    "When you press the pedals, they turn a crank that spins the front chainring.",
    "The chain wraps around that ring and carries the motion to a small cog on the back wheel.",
    "Because the rear cog is smaller, the wheel turns several times for each turn of the pedals.",
    "Gears let you change that ratio, so climbing a hill feels lighter and a flat road feels fast.",
    "A derailleur moves the chain sideways from one cog to the next when you shift.",
    "Brakes press rubber pads against the rim, or against a disc, and friction slows you down.",
    "Keeping the chain clean and oiled makes every ride quieter and smoother.",
    "Tyres hold air at a set pressure, which decides how the bike grips and rolls.",
    "The frame ties everything together and sets how upright or stretched out you sit.",
    "Steering works through the fork and the handlebars, and balance comes from small corrections.",
    "Once you are moving, the spinning wheels help keep the bicycle steady.",
    "Lights and a bell are simple additions that make riding at dusk much safer.",
    "With a little practice, all of these parts start to feel like one smooth machine.",
    "Old steam engines heated water in a boiler until it turned into high-pressure steam.",
    "That steam pushed a piston back and forth inside a sealed cylinder.",
    "A connecting rod turned the piston's motion into the rotation of a heavy flywheel.",
    "Valves opened and closed in time so that fresh steam always pushed the right side.",
    "The keeper climbed the spiral stairs each evening to light the great lamp.",
    "Ships far out at sea watched for its slow, steady flash and knew where the rocks were.",
)
SOUP = (" the", "的", " и", "그", " de", "の", " 是", "ของ", " за", "에서", " und", "人", " que", "ं")


def log(source: str, level: str, where: str, message: str) -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    pid = API_PID if source == "APIServer" else CORE_PID
    print(f"({source} pid={pid}) {level} {stamp} [{where}] {message}", flush=True)


def tokenize(text: str) -> list[str]:
    return re.findall(r"\s*[A-Za-z]+|\s*\d|\s*[^\sA-Za-z\d]|\s+", text)


# --- arguments --------------------------------------------------------------------------


def parse_args(argv: list[str]) -> dict[str, str]:
    """vLLM's flags: the ones this stand-in uses are kept, every other one is ignored."""
    if not argv or argv[0] != "serve" or len(argv) < 2:
        print("usage: vllm serve MODEL [options]", file=sys.stderr)
        raise SystemExit(2)
    opts = {"model": argv[1], "host": "0.0.0.0", "port": "8000"}
    rest = argv[2:]
    i = 0
    while i < len(rest):
        arg = rest[i]
        if arg.startswith("--"):
            if "=" in arg:
                key, value = arg[2:].split("=", 1)
            elif i + 1 < len(rest) and not rest[i + 1].startswith("--"):
                key, value = arg[2:], rest[i + 1]
                i += 1
            else:
                key, value = arg[2:], "true"
            opts[key.replace("-", "_")] = value
        i += 1
    return opts


def pick(spec: str, backend: str, default: str) -> str:
    """`value` or `key=value,key=value,*=value` chosen by backend."""
    if "=" not in spec:
        return spec or default
    table = dict(item.split("=", 1) for item in spec.split(",") if "=" in item)
    return table.get(backend, table.get("*", default))


# --- answers ----------------------------------------------------------------------------


def _arith(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


WRONG_WORDS = {"Paris": "Berlin", "Tuesday": "Wednesday", "cold": "warm", "Jupiter": "Saturn",
               "blue": "green"}  # fmt: skip


def known_answer(prompt: str, chat: bool, wrong: bool) -> str | None:
    """What a working model says to the known-answer questions (or a fluent wrong one)."""
    p = prompt

    def word(w: str, sentence: str) -> str:
        w = WRONG_WORDS.get(w, w) if wrong else w
        return sentence.format(w)

    if "capital of France" in p:
        return word("Paris", "The capital of France is {}." if chat else " {}.")
    m = re.search(r"(\d+) ([-+*]) (\d+)", p)
    if m:
        r = _arith(int(m.group(1)), m.group(2), int(m.group(3))) + (1 if wrong else 0)
        if not chat:
            return f" {r}\n"
        return f"{m.group(1)} {m.group(2)} {m.group(3)} = {r}" if r > 100 else str(r)
    if "freez" in p:
        r = 10 if wrong else 0
        return f"Water freezes at {r} degrees Celsius." if chat else f" {r} degrees."
    if "Count" in p:
        seq = [1, 2, 3, 4, 5, 6, 8, 9, 10] if wrong else list(range(1, 11))
        if chat:
            return ", ".join(map(str, seq))
        return " " + ", ".join(map(str, seq[3:])) + "."
    m = re.search(r"[A-Z0-9]{4}-[A-Z0-9]{4}-[A-Z0-9]{4}", p)
    if m:
        code = m.group(0)
        if wrong:
            code = code[:-1] + ("X" if code[-1] != "X" else "Y")
        return code
    if "JSON" in p:
        pairs = re.findall(r'"(\w+)" set to (?:the (?:string|number) )?("[^"]*"|\d+)', p)
        obj = {k: json.loads(v) for k, v in pairs}
        if wrong:
            obj = {k: (v + 1 if isinstance(v, int) else v) for k, v in obj.items()}
        return json.dumps(obj)
    if "after Monday" in p:
        return word("Tuesday", "The day after Monday is {}." if chat else " {}.")
    if "opposite of hot" in p:
        return word("cold", "{}" if chat else " {}.")
    if "spider" in p:
        r = 6 if wrong else 8
        return f"{r}" if chat else f" {r}."
    if "largest planet" in p:
        return word("Jupiter", "{} is the largest planet." if chat else " {}.")
    if "sky" in p:
        return word("blue", "{}." if chat else " {}.")
    return None


def fluent_text(prompt: str, n_sentences: int) -> str:
    rng = random.Random(zlib.crc32(prompt.encode()))
    order = list(FLUENT)
    rng.shuffle(order)
    return " ".join(order[i % len(order)] for i in range(n_sentences))


def garbage_tokens(mode: str, n: int, seed: int) -> list[str]:
    if mode == "loop":
        return (["lock"] + ["handle"] * n)[:n]
    if mode == "apostrophe":
        unit = ["'s", "'s", "'s", "'t", "'s", "'s"]
        return [unit[i % len(unit)] for i in range(n)]
    if mode == "bang":
        return ["!"] * n
    if mode == "empty":
        return []
    if mode == "short":
        return ["The"]
    if mode == "special":
        return ["<|box_end|>"] * n
    if mode == "tagloop":
        return [("\n\n" if i % 2 == 0 else "</") for i in range(n)]
    if mode == "soup":
        rng = random.Random(seed)
        return [rng.choice(SOUP) for _ in range(n)]
    raise ValueError(mode)


class Engine:
    """The 'model': turns a request into a token list, counts what /metrics reports."""

    def __init__(self, model: str, served: str, mode: str, toks_per_s: float, reasoning: bool):
        self.model, self.served, self.mode = model, served, mode
        self.delay = 1.0 / toks_per_s
        self.reasoning = reasoning
        self.lock = threading.Lock()
        self.running = 0
        self.counters = {
            "prompt_tokens": 0.0, "generation_tokens": 0.0, "requests": 0.0,
            "itl_sum": 0.0, "itl_count": 0.0, "ttft_sum": 0.0, "ttft_count": 0.0,
        }  # fmt: skip
        self.itl_buckets = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 1.0, 2.5]
        self.itl_counts = [0] * len(self.itl_buckets)

    def plan(self, prompt: str, chat: bool, max_tokens: int, ignore_eos: bool) -> list[str]:
        mode = self.mode
        if mode in GARBAGE_MODES:
            return garbage_tokens(mode, max_tokens, zlib.crc32(prompt.encode()))[:max_tokens]
        answer = known_answer(prompt, chat, wrong=mode == "wrong")
        if answer is None:
            answer = (" " if not chat else "") + fluent_text(prompt, 12)
        tokens = tokenize(answer)
        if ignore_eos:
            k = 0
            while len(tokens) < max_tokens:
                tokens += tokenize(" " + fluent_text(prompt + str(k), 6))
                k += 1
        return tokens[:max_tokens]

    def emit(self, tokens: list[str], prompt_tokens: int, write_token) -> int:
        """Stream tokens with decode delays; returns how many were emitted."""
        with self.lock:
            self.running += 1
            self.counters["prompt_tokens"] += prompt_tokens
        start = time.monotonic()
        try:
            time.sleep(0.01 + 0.0004 * prompt_tokens)  # prefill
            last = None
            for i, tok in enumerate(tokens):
                with self.lock:
                    crowded = self.running > 1
                if crowded and self.mode == "crash-concurrency":
                    log("EngineCore_DP0", "ERROR", "core.py:934", "EngineCore encountered a fatal error.")
                    log("EngineCore_DP0", "ERROR", "core.py:934",
                        "torch.AcceleratorError: CUDA error: an illegal memory access was encountered")
                    log("APIServer", "ERROR", "async_llm.py:525", "AsyncLLM output_handler failed.")
                    log("APIServer", "ERROR", "async_llm.py:525", "vllm.v1.engine.exceptions.EngineDeadError: "
                        "EngineCore encountered an issue. See stack trace (above) for the root cause.")
                    os._exit(1)
                if crowded and self.mode == "concurrency-bang":
                    tok = "!"
                if i > 0:
                    time.sleep(self.delay)
                now = time.monotonic()
                write_token(tok)
                with self.lock:
                    self.counters["generation_tokens"] += 1
                    if last is None:
                        self.counters["ttft_sum"] += now - start
                        self.counters["ttft_count"] += 1
                    else:
                        gap = now - last
                        self.counters["itl_sum"] += gap
                        self.counters["itl_count"] += 1
                        for b, edge in enumerate(self.itl_buckets):
                            if gap <= edge:
                                self.itl_counts[b] += 1
                last = now
            return len(tokens)
        finally:
            with self.lock:
                self.running -= 1
                self.counters["requests"] += 1

    def metrics_text(self) -> str:
        labels = f'engine="0",model_name="{self.served}"'
        with self.lock:
            c = dict(self.counters)
            running = self.running
            buckets = list(self.itl_counts)
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{labels}}} {float(running)}",
            "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{{{labels}}} {c['prompt_tokens']}",
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{{{labels}}} {c['generation_tokens']}",
            "# HELP vllm:request_success_total Count of successfully processed requests.",
            "# TYPE vllm:request_success_total counter",
            f'vllm:request_success_total{{{labels},finished_reason="length"}} {c["requests"]}',
            "# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.",
            "# TYPE vllm:time_to_first_token_seconds histogram",
            f"vllm:time_to_first_token_seconds_sum{{{labels}}} {c['ttft_sum']}",
            f"vllm:time_to_first_token_seconds_count{{{labels}}} {c['ttft_count']}",
            "# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.",
            "# TYPE vllm:inter_token_latency_seconds histogram",
        ]
        total = 0
        for edge, count in zip(self.itl_buckets, buckets, strict=True):
            total = count
            lines.append(f'vllm:inter_token_latency_seconds_bucket{{{labels},le="{edge}"}} {float(total)}')
        lines.append(f'vllm:inter_token_latency_seconds_bucket{{{labels},le="+Inf"}} {c["itl_count"]}')
        lines.append(f"vllm:inter_token_latency_seconds_sum{{{labels}}} {c['itl_sum']}")
        lines.append(f"vllm:inter_token_latency_seconds_count{{{labels}}} {c['itl_count']}")
        return "\n".join(lines) + "\n"


# --- HTTP -------------------------------------------------------------------------------

STATE = {"ready": False}


def fake_logprobs(tok: str, k: int) -> dict[str, float]:
    alts = [tok, " the", " a", ",", ".", " and", " of", "\n"]
    out: dict[str, float] = {}
    for alt in alts:
        if len(out) >= k:
            break
        out.setdefault(alt, -0.05 if alt == tok else -3.0 - len(out))
    return out


class Handler(BaseHTTPRequestHandler):
    engine: Engine
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # As uvicorn does: without it, Nagle + delayed ACK add ~40 ms to every response.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: object) -> None:  # uvicorn-style access log
        status = args[1] if len(args) > 1 else ""
        print(f'(APIServer pid={API_PID}) INFO:     {self.client_address[0]}:{self.client_address[1]} - '
              f'"{self.command} {self.path} HTTP/1.1" {status}', flush=True)

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, code: int, doc: object) -> None:
        self._send(code, json.dumps(doc).encode())

    def _error(self, code: int, message: str, etype: str, param: str | None = None) -> None:
        self._json(code, {"error": {"message": message, "type": etype, "param": param, "code": code}})

    def do_GET(self) -> None:
        if self.path == "/health":
            if STATE["ready"]:
                self._send(200, b"", "text/plain")
            else:
                self._send(503, b"", "text/plain")
            return
        if not STATE["ready"]:
            self._error(503, "Server is starting", "ServiceUnavailableError")
            return
        if self.path == "/v1/models":
            e = self.engine
            self._json(200, {"object": "list", "data": [{
                "id": e.served, "object": "model", "created": int(time.time()), "owned_by": "vllm",
                "root": e.model, "parent": None, "max_model_len": 32768}]})
        elif self.path == "/metrics":
            self._send(200, self.engine.metrics_text().encode(), "text/plain; version=0.0.4")
        elif self.path == "/version":
            self._json(200, {"version": VERSION})
        else:
            self._error(404, f"Not Found: {self.path}", "NotFoundError")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._error(400, "Invalid JSON body", "BadRequestError")
            return
        if not STATE["ready"]:
            self._error(503, "Server is starting", "ServiceUnavailableError")
            return
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            self._error(404, f"Not Found: {self.path}", "NotFoundError")
            return
        e = self.engine
        if body.get("model") not in (e.served, e.model):
            self._error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError", "model")
            return
        chat = self.path.endswith("chat/completions")
        if chat and os.environ.get("FAKE_VLLM_NO_CHAT_TEMPLATE") == "1":
            self._error(400, "As of transformers v4.44, default chat template is no longer allowed, so you "
                        "must provide a chat template if the tokenizer does not define one.", "BadRequestError")
            return
        if chat:
            msgs = body.get("messages") or []
            prompt = "\n".join(str(m.get("content", "")) for m in msgs)
            template_tokens = 12
        else:
            prompt = str(body.get("prompt", ""))
            template_tokens = 0
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        thinking = (
            chat and e.reasoning
            and (body.get("chat_template_kwargs") or {}).get("enable_thinking", True) is not False
        )
        tokens = e.plan(prompt, chat, max_tokens, bool(body.get("ignore_eos")))
        n_think = 0
        if thinking:  # the reasoning parser moves these to reasoning_content
            think = tokenize("Okay, the user is asking a question. Let me think about it step by step. " * 20)
            n_think = min(len(think), max_tokens)
            tokens = (think[:n_think] + tokens)[:max_tokens]
        finish = "length" if len(tokens) >= max_tokens else "stop"
        prompt_tokens = len(tokenize(prompt)) + template_tokens
        k = 0
        if chat and body.get("logprobs"):
            k = int(body.get("top_logprobs") or 1)
        elif not chat and body.get("logprobs") is not None:
            k = int(body["logprobs"])
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{random.getrandbits(64):016x}"
        created = int(time.time())
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(tokens),
                 "total_tokens": prompt_tokens + len(tokens)}  # fmt: skip
        if body.get("stream"):
            self._stream(body, chat, tokens, n_think, k, rid, created, finish, usage, prompt_tokens)
        else:
            self._whole(body, chat, tokens, n_think, k, rid, created, finish, usage, prompt_tokens)

    def _whole(self, body, chat, tokens, n_think, k, rid, created, finish, usage, prompt_tokens) -> None:
        out: list[str] = []
        self.engine.emit(tokens, prompt_tokens, out.append)
        answer = out[n_think:]
        text = "".join(answer)
        if chat:
            message = {"role": "assistant", "content": text if answer or not n_think else None,
                       "reasoning_content": "".join(out[:n_think]) or None, "tool_calls": []}
            choice: dict[str, object] = {"index": 0, "message": message, "finish_reason": finish,
                                         "stop_reason": None}
            if k:
                choice["logprobs"] = {"content": [
                    {"token": t, "logprob": -0.05, "bytes": list(t.encode()),
                     "top_logprobs": [{"token": a, "logprob": lp} for a, lp in fake_logprobs(t, k).items()]}
                    for t in answer]}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish, "stop_reason": None,
                      "logprobs": None}
            if k:
                offsets, pos = [], 0
                for t in answer:
                    offsets.append(pos)
                    pos += len(t)
                choice["logprobs"] = {"tokens": answer, "token_logprobs": [-0.05] * len(answer),
                                      "top_logprobs": [fake_logprobs(t, k) for t in answer],
                                      "text_offset": offsets}
            obj = "text_completion"
        self._json(200, {"id": rid, "object": obj, "created": created, "model": body["model"],
                         "choices": [choice], "usage": usage})

    def _stream(self, body, chat, tokens, n_think, k, rid, created, finish, usage, prompt_tokens) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")  # as uvicorn streams: one chunk per event
        self.end_headers()

        def send_chunk(data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choice: dict[str, object] | None, extra: dict[str, object] | None = None) -> None:
            doc: dict[str, object] = {"id": rid, "object": obj, "created": created,
                                      "model": body["model"], "choices": [choice] if choice else []}
            if extra:
                doc.update(extra)
            send_chunk(b"data: " + json.dumps(doc).encode() + b"\n\n")

        if chat:
            chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                   "finish_reason": None})
        seen = [0]

        def write_token(tok: str) -> None:
            i = seen[0]
            seen[0] += 1
            if chat:
                key = "reasoning_content" if i < n_think else "content"
                chunk({"index": 0, "delta": {key: tok}, "logprobs": None, "finish_reason": None})
            else:
                lp = None
                if k:
                    lp = {"tokens": [tok], "token_logprobs": [-0.05],
                          "top_logprobs": [fake_logprobs(tok, k)], "text_offset": [0]}
                chunk({"index": 0, "text": tok, "logprobs": lp, "finish_reason": None,
                       "stop_reason": None})

        # Real vLLM 0.26 sent 256 ignore_eos tokens in 222-223 events: some events carry two
        # tokens. Replayed on ignore_eos streams (every FAKE_VLLM_PAIR_EVERY-th token waits for
        # the next); usage still counts every token, so only a client that counts events errs.
        pair_every = int(os.environ.get("FAKE_VLLM_PAIR_EVERY", "7")) if body.get("ignore_eos") and not k else 0
        held: list[str] = []
        counted = [0]

        def paired(tok: str) -> None:
            held.append(tok)
            counted[0] += 1
            if counted[0] % pair_every == 0 and len(held) == 1:
                return  # sent with the next token, in one event
            write_token("".join(held))
            held.clear()

        try:
            self.engine.emit(tokens, prompt_tokens, paired if pair_every else write_token)
            if held:
                write_token("".join(held))
            if chat:
                chunk({"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish,
                       "stop_reason": None})
            else:
                chunk({"index": 0, "text": "", "logprobs": None, "finish_reason": finish,
                       "stop_reason": None})
            if (body.get("stream_options") or {}).get("include_usage"):
                chunk(None, {"usage": usage})
            send_chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:  # a client hanging up is normal
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


# --- start-up ---------------------------------------------------------------------------


def startup_log(opts: dict[str, str], moe: str, linear: str, mode: str) -> None:
    log("APIServer", "INFO", "api_server.py:1885", f"vLLM API server version {VERSION}")
    shown = {k: v for k, v in opts.items() if k not in ("host", "port", "fake_mode")}
    log("APIServer", "INFO", "utils.py:328", f"non-default args: {shown}")
    for name in REMOVED_ENV:
        if name in os.environ:
            log("APIServer", "WARNING", "envs.py:1687", f"Unknown vLLM environment variable detected: {name}")
    log("APIServer", "INFO", "model.py:547", "Resolved architecture: Qwen3MoeForCausalLM")
    log("APIServer", "INFO", "model.py:1510", "Using max model len 32768")
    log("APIServer", "INFO", "cache.py:202",
        f"Using {opts.get('kv_cache_dtype', 'auto')} data type to store kv cache.")
    log("EngineCore_DP0", "INFO", "core.py:93", f"Initializing a V1 LLM engine (v{VERSION}) with config: "
        f"model='{opts['model']}', quantization=modelopt_fp4, enforce_eager=False")
    log("EngineCore_DP0", "INFO", "gpu_model_runner.py:3318", f"Starting to load model {opts['model']}...")
    log("EngineCore_DP0", "INFO", "cuda.py:411",
        "Using FLASHINFER attention backend out of potential backends: ['FLASHINFER', 'TRITON_ATTN']")
    ran_moe = ("flashinfer_cutlass" if moe == "marlin" else "marlin") if mode == "mismatch" else moe
    ran_linear = "marlin" if mode == "degraded-marlin" else linear
    if mode == "degraded-marlin":
        log("EngineCore_DP0", "WARNING", "marlin_utils_fp4.py:226",
            "Your GPU does not have native support for FP4 computation but FP4 quantization is being "
            "used. Weight-only FP4 compression will be used leveraging the Marlin kernel. This may "
            "degrade performance for compute-heavy workloads.")
    log("EngineCore_DP0", "INFO", "__init__.py:683",
        f"Using {LINEAR_KERNEL.get(ran_linear, 'CutlassNvFp4LinearKernel')} for NVFP4 GEMM")
    log("EngineCore_DP0", "INFO", "nvfp4.py:331",
        f"Using '{MOE_ENUM.get(ran_moe, ran_moe.upper())}' NvFp4 MoE backend out of potential backends: "
        "['FLASHINFER_TRTLLM', 'FLASHINFER_CUTEDSL', 'FLASHINFER_CUTEDSL_BATCHED', "
        "'FLASHINFER_CUTLASS', 'VLLM_CUTLASS', 'MARLIN', 'EMULATION'].")


def crash(mode: str) -> None:
    log("EngineCore_DP0", "INFO", "default_loader.py:267", "Loading weights took 31.25 seconds")
    log("EngineCore_DP0", "ERROR", "core.py:866", "EngineCore failed to start.")
    log("EngineCore_DP0", "ERROR", "core.py:866", "Traceback (most recent call last):")
    log("EngineCore_DP0", "ERROR", "core.py:866", '  File "/usr/local/lib/python3.12/dist-packages/'
        'vllm/v1/engine/core.py", line 857, in run_engine_core')
    log("EngineCore_DP0", "ERROR", "core.py:866", CRASH_LINES[mode])
    print(f"(APIServer pid={API_PID}) RuntimeError: Engine core initialization failed. See root cause "
          "above. Failed core proc(s): {}", flush=True)
    raise SystemExit(1)


# Recorded from real vLLM 0.26.0 (tests/data/coherence/vllm-0.26.0-h200): argparse's
# choices for --moe-backend, and the config refusal of a --max-model-len above the model's.
REAL_MOE_CHOICES = (
    "aiter", "auto", "cutlass", "deep_gemm", "deep_gemm_mega_moe", "emulation", "flashinfer_b12x",
    "flashinfer_cutedsl", "flashinfer_cutlass", "flashinfer_trtllm", "flydsl", "hpc", "humming",
    "marlin", "triton", "triton_unfused",
)  # fmt: skip
MAX_POSITION_EMBEDDINGS = 8192


def refuse_args(opts: dict[str, str]) -> None:
    """Exit as real vLLM does for a flag or config it refuses (argparse: 2; config: 1)."""
    moe = opts.get("moe_backend")
    if moe is not None and moe not in REAL_MOE_CHOICES and moe not in MOE_ENUM and moe not in DEFAULT_TOKS:
        time.sleep(float(os.environ.get("FAKE_VLLM_IMPORT_S", "0")))  # vLLM imports ~30 s first
        choices = ", ".join(repr(c) for c in REAL_MOE_CHOICES)
        print("usage: vllm serve [model_tag] [options]", file=sys.stderr)
        print(f"main.py serve: error: argument --moe-backend: invalid choice: {moe!r} (choose from {choices})",
              file=sys.stderr, flush=True)
        raise SystemExit(2)
    wanted = opts.get("max_model_len")
    if wanted is not None and wanted.isdigit() and int(wanted) > MAX_POSITION_EMBEDDINGS:
        log("APIServer", "INFO", "api_utils.py:273", f"non-default args: {opts}")
        print(f"(APIServer pid={API_PID}) pydantic_core._pydantic_core.ValidationError: 1 validation error for "
              "ModelConfig", flush=True)
        print(f"(APIServer pid={API_PID})   Value error, User-specified max_model_len ({wanted}) is greater than "
              f"the derived max_model_len (max_position_embeddings={MAX_POSITION_EMBEDDINGS}.0 or "
              "model_max_length=None in model's config.json). To allow overriding this maximum, set the env var "
              "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. [type=value_error, input_value=ArgsKwargs((), {...}), "
              "input_type=ArgsKwargs]", flush=True)
        raise SystemExit(1)


def log_start(opts: dict[str, str], moe: str, linear: str) -> int:
    """Append this start to FAKE_VLLM_START_LOG (one line each) and return how many starts
    of the same backends came before it (0 without a log). A test reads the file to see
    the order the gate started its servers in, which no server log left behind shows."""
    path = os.environ.get("FAKE_VLLM_START_LOG")
    if not path:
        return 0
    key = f"moe={moe} linear={linear} kv={opts.get('kv_cache_dtype', 'auto')}"
    try:
        with open(path, encoding="utf-8") as fh:
            before = sum(1 for line in fh if line.split(" pid=")[0] == key)
    except FileNotFoundError:
        before = 0
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, f"{key} pid={os.getpid()} t={time.time():.3f}\n".encode())
    finally:
        os.close(fd)
    return before


def main(argv: list[str]) -> int:
    opts = parse_args(argv)
    refuse_args(opts)
    moe = opts.get("moe_backend", "auto").lower().replace("-", "_")
    linear = opts.get("linear_backend", moe if moe in LINEAR_KERNEL else "auto").lower().replace("-", "_")
    spec = opts.get("fake_mode") or os.environ.get("FAKE_VLLM_MODE", "coherent")
    mode = pick(spec, moe, "coherent")
    start = log_start(opts, moe, linear)
    choices = pick(os.environ.get("FAKE_VLLM_TOKS_PER_S", ""), moe, str(DEFAULT_TOKS.get(moe, 60.0))).split("/")
    toks = float(choices[start % len(choices)])  # `100/300`: 100 tok/s on the first start, 300 on the second, ...
    startup_s = float(os.environ.get("FAKE_VLLM_STARTUP_S", "3"))
    served = opts.get("served_model_name", opts["model"])
    engine = Engine(opts["model"], served, mode, toks, os.environ.get("FAKE_VLLM_REASONING") == "1")

    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # PID 1 in a container: exit on stop
    startup_log(opts, moe, linear, mode)
    load_s = os.environ.get("FAKE_VLLM_LOAD_S")
    # Real vLLM 0.26 keeps its port closed for the whole load (129.5 s recorded for a 135M
    # model), then answers /health 200 at the first connection: FAKE_VLLM_LOAD_S replays that.
    time.sleep(float(load_s) if load_s else startup_s * 0.3)
    if mode in CRASH_LINES:
        crash(mode)
    if mode == "crash-exit":  # killed without a word (e.g. the OOM killer): only the exit tells
        log("EngineCore_DP0", "INFO", "default_loader.py:267", "Loading weights took 31.25 seconds")
        raise SystemExit(3)
    Handler.engine = engine
    server = Server((opts["host"], int(opts["port"])), Handler)
    log("APIServer", "INFO", "api_server.py:1904", f"Starting vLLM API server 0 on http://{opts['host']}:{opts['port']}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    log("EngineCore_DP0", "INFO", "gpu_model_runner.py:4101", "Graph capturing finished in 12 secs, took 0.52 GiB")
    if not load_s:
        time.sleep(startup_s * 0.7)  # listening, /health answers 503 while the engine warms up
    if mode != "hang":
        STATE["ready"] = True
        print(f"(APIServer pid={API_PID}) INFO:     Application startup complete.", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
