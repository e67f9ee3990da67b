"""A planted faulty server (test helper): a minimal OpenAI-compatible app in vLLM's response format, in front of a
REAL engine — llama.cpp running a tiny F32 GGUF (``LlamaCppModel``, float32 K/V) — that injects one fault at a time.

Standard library only (``http.server.ThreadingHTTPServer`` on 127.0.0.1, a free port): ``/v1/models``
(``owned_by: vllm``), ``/v1/completions`` (token-id prompts, ``logprobs`` with ``return_tokens_as_token_ids`` keys,
``prompt_logprobs``, ``seed``, ``stop``, ``max_tokens``, ``logit_bias``), ``/tokenize`` (``prompt`` or
``messages``). The engine is one llama.cpp context behind a lock; requests in flight are counted, which is what the
concurrency fault keys on.

Faults (``server.fault``): ``template`` (the messages rendered without the system turn), ``stale_prefix`` (a prompt
that shares its first 16 tokens with an earlier one gets the earlier one's answer), ``shift`` (each step's
log-probabilities are the next step's), ``wrong_token`` (the sampled token's log-probability is id + 1's: an
off-by-one index), ``nondeterminism`` (logits perturbed by N(0, 0.05²) while another request is in flight), and the
bad servers ``error500`` (completions only), ``hang`` (answers after 2 s), ``no_logprobs``.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

FAULTS = ("template", "stale_prefix", "shift", "wrong_token", "nondeterminism")
STALE_KEY = 16
NOISE = 0.05
HANG_S = 2.0


def log_softmax(row: np.ndarray) -> np.ndarray:
    x = row.astype(np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


def top_entries(lp: np.ndarray, k: int, token: int) -> dict[str, float]:
    """The top ``k`` ids (and the token) as vLLM's ``token_id:N`` keys."""
    ids = [int(i) for i in np.argsort(-lp, kind="stable")[:k]]
    return {f"token_id:{i}": float(lp[i]) for i in [*ids, token]}


class TinyServer:
    """The app's state: the engine, the tokenizer, the chat template, the fault."""

    def __init__(self, engine: Any, hf_tokenizer: Any, chat_template: str):
        self.engine, self.hf, self.template = engine, hf_tokenizer, chat_template
        self.fault = ""
        self.lock = threading.Lock()
        self.in_flight = 0
        self.count_lock = threading.Lock()
        self.stale: dict[tuple[int, ...], tuple[tuple[int, ...], dict]] = {}
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "TinyServer":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def set_fault(self, fault: str) -> None:
        self.fault = fault
        self.stale.clear()

    # ---- endpoints ----------------------------------------------------------------------------------------
    def tokenize(self, body: dict) -> dict:
        if "messages" in body:
            messages = body["messages"]
            if self.fault == "template":
                messages = [m for m in messages if m["role"] != "system"]
            text = self.hf.apply_chat_template(
                messages, chat_template=self.template, add_generation_prompt=True, tokenize=False
            )
            tokens = self.hf.encode(text, add_special_tokens=False)
        else:
            tokens = self.hf.encode(body["prompt"], add_special_tokens=True)
        return {"tokens": list(tokens), "count": len(tokens)}

    def complete(self, body: dict) -> dict:
        prompt = tuple(int(t) for t in body["prompt"])
        key = prompt[:STALE_KEY]
        if self.fault == "stale_prefix" and key in self.stale and self.stale[key][0] != prompt:
            return self.stale[key][1]
        answer = self._generate(prompt, body)
        if self.fault == "stale_prefix":
            self.stale.setdefault(key, (prompt, answer))
        return answer

    def _generate(self, prompt: tuple[int, ...], body: dict) -> dict:
        k, n = int(body.get("logprobs") or 0), int(body["max_tokens"])
        temp, seed = float(body.get("temperature", 1.0)), body.get("seed")
        sampler = np.random.default_rng(seed)
        noise = np.random.default_rng()
        rows: list[np.ndarray] = []

        bias = {int(t): float(v) for t, v in (body.get("logit_bias") or {}).items()}

        def pick(row: np.ndarray, history: list[int]) -> int:
            for t, v in bias.items():
                row = row.copy()
                row[t] += v
            if self.fault == "nondeterminism" and self.in_flight > 1:
                row = row + noise.normal(0.0, NOISE, row.shape)
            lp = log_softmax(row)
            rows.append(lp)
            if temp == 0:
                return int(np.argmax(lp))
            p = np.exp(log_softmax(row / temp))
            return int(sampler.choice(len(p), p=p / p.sum()))

        with self.lock:
            tokens = self.engine.generate(list(prompt), n, pick, stop_ids=(self.engine.eos_id,))
            prompt_rows = self.engine.logits(list(prompt)) if body.get("prompt_logprobs") is not None else None
        tokens, text, reason = self._stop(tokens, body.get("stop") or [], n)
        choice = {"index": 0, "text": text, "finish_reason": reason, "logprobs": self._logprobs(tokens, rows, k)}
        if prompt_rows is not None:
            pk = int(body["prompt_logprobs"])
            choice["prompt_logprobs"] = [None] + [
                {key.split(":")[1]: {"logprob": v} for key, v in top_entries(log_softmax(r), pk, t).items()}
                for r, t in zip(prompt_rows[:-1], prompt[1:], strict=True)
            ]
        return {"object": "text_completion", "model": "tiny", "choices": [choice]}

    def _stop(self, tokens: list[int], stops: list[str], n: int) -> tuple[list[int], str, str]:
        for i in range(1, len(tokens) + 1 if stops else 1):
            text = self.hf.decode(tokens[:i], skip_special_tokens=True)
            hits = [text.find(s) for s in stops if s in text]
            if hits:
                return tokens[:i], text[: min(hits)], "stop"
        reason = "stop" if tokens and tokens[-1] == self.engine.eos_id else "length"
        return tokens, self.hf.decode(tokens, skip_special_tokens=True), reason

    def _logprobs(self, tokens: list[int], rows: list[np.ndarray], k: int) -> dict | None:
        if self.fault == "no_logprobs":
            return None
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": []}
        for s, t in enumerate(tokens):
            lp = rows[min(s + 1, len(rows) - 1)] if self.fault == "shift" else rows[s]
            value = float(lp[t])
            if self.fault == "wrong_token":  # an off-by-one vocabulary index
                value = float(lp[(t + 1) % len(lp)])
            out["tokens"].append(f"token_id:{t}")
            out["token_logprobs"].append(value)
            out["top_logprobs"].append({**top_entries(lp, k, t), f"token_id:{t}": value})
        return out


def _handler(server: TinyServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _send(self, code: int, obj: Any) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if server.fault == "hang":
                time.sleep(HANG_S)
            if self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": "tiny", "owned_by": "vllm"}]})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
            if server.fault == "error500" and self.path == "/v1/completions":
                self._send(500, {"error": "planted"})
                return
            with server.count_lock:
                server.in_flight += 1
            try:
                if self.path == "/tokenize":
                    self._send(200, server.tokenize(body))
                elif self.path == "/v1/completions":
                    try:
                        answer = server.complete(body)
                    except ValueError as exc:  # vLLM answers 400 to a request it cannot serve
                        self._send(400, {"error": {"message": str(exc)}})
                        return
                    self._send(200, answer)
                else:
                    self._send(404, {"error": "not found"})
            finally:
                with server.count_lock:
                    server.in_flight -= 1

    return Handler
