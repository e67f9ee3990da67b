"""A live OpenAI-compatible server as a :class:`genprobe.engine.backend.Backend` (issue #47).

Standard library HTTP only: every request has a timeout and bounded retries, so an unreachable or stuck server is
one :class:`EndpointError` (the CLI's one-line exit 2), never a hang. The server kind is read off ``/v1/models`` and
the extras it answers: **vLLM** (token-id prompts, top-k keyed ``"token_id:N"``, ``prompt_logprobs``, ``/tokenize``
with ``prompt`` or ``messages``, cached-token counts), **llama-cpp-python** (text prompts, log-probs keyed by token
text, mapped back to ids through the reference's ``pieces``; ``/extras/tokenize``), or anything else, treated like
the latter without a tokenizer endpoint (docs/live-serving.md).
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ..engine.backend import Backend, Capabilities, Position, Request, Response

if TYPE_CHECKING:  # pragma: no cover
    from ..model.load import Model

MAX_LOGPROBS = 20  # vLLM's default --max-logprobs, and the OpenAI API's legacy completions limit


class EndpointError(ValueError):
    """The server could not be used (unreachable, an error answer, a timeout, an answer of the wrong form)."""


@dataclass(frozen=True)
class HttpSettings:
    """Per-request timeout, retries after a connection error / timeout / 5xx, and the pause between tries."""

    timeout_s: float = 60.0
    retries: int = 2
    backoff_s: float = 0.5


class EndpointBackend(Backend):
    """A live server behind the :class:`~genprobe.engine.backend.Backend` protocol, JSON over HTTP with bounded
    retries. ``pieces``: each token's text → its id in the reference tokenizer (only pieces one id has), what
    text-keyed log-probs are mapped back with."""

    def __init__(self, url: str, settings: HttpSettings = HttpSettings(), pieces: Mapping[str, int] | None = None):
        self.root = url.rstrip("/").removesuffix("/v1")  # http://host:8000/v1 or http://host:8000/ -> http://host:8000
        self.settings = settings
        # the server kind and served model from /v1/models and the extras the server answers
        models = self.call("/v1/models")
        data = models.get("data") if isinstance(models, dict) else None
        if not data:
            raise EndpointError(f"{self.root}/v1/models lists no model: is this an OpenAI-compatible server?")
        self.model_name, vllm = str(data[0].get("id", "")), str(data[0].get("owned_by", "")) == "vllm"
        llama_cpp_python = not vllm and self.call("/extras/tokenize", {"input": "a"}, optional=True) is not None
        self.server = "vllm" if vllm else "llama-cpp-python" if llama_cpp_python else "openai-compatible"
        self.capabilities = Capabilities(
            server=self.server,
            max_top_k=MAX_LOGPROBS,
            prompt_logprobs=vllm,
            token_prompts=vllm,
            concurrency=64,
            seed=True,
        )
        self.pieces = dict(pieces or {})

    def call(self, path: str, body: Mapping[str, Any] | None = None, optional: bool = False) -> Any:
        """GET (``body`` None) or POST ``path``; the JSON answer. ``optional``: None when the server has no such
        endpoint (404/405) or refuses the request (400/422) instead of an error."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.root + path, data=data, headers={"Content-Type": "application/json"})
        tries, problem = self.settings.retries + 1, ""
        for attempt in range(tries):
            try:
                with urllib.request.urlopen(req, timeout=self.settings.timeout_s) as answer:
                    return json.loads(answer.read().decode("utf-8"))
            except urllib.error.HTTPError as exc:
                if optional and exc.code in (400, 404, 405, 422):
                    return None
                try:
                    detail = " ".join(exc.read().decode("utf-8", "replace").split())[:200] or str(exc.reason)
                except OSError:
                    detail = exc.reason
                if exc.code < 500:
                    raise EndpointError(f"{self.root}{path} answered {exc.code}: {detail}") from None
                problem = f"answered {exc.code}: {detail}"
            except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError) as exc:
                reason = getattr(exc, "reason", exc)
                problem = (
                    f"timed out after {self.settings.timeout_s:g} s" if "timed out" in str(reason) else str(reason)
                )
            except json.JSONDecodeError:
                raise EndpointError(f"{self.root}{path} did not answer JSON") from None
            if attempt + 1 < tries:
                time.sleep(self.settings.backoff_s * (attempt + 1))
        raise EndpointError(f"{self.root}{path} {problem} ({tries} tries)")

    # ---- requests ---------------------------------------------------------------------------------------
    def complete(self, request: Request) -> Response:
        """One ``/v1/completions`` call (token ids where the server takes them, else text)."""
        if not isinstance(request.prompt, str) and not self.capabilities.token_prompts:
            raise ValueError(f"the {self.server} server takes text prompts, not token ids")
        body = {"model": self.model_name, "prompt": request.prompt, "stream": False, **completion_fields(request)}
        if self.server == "vllm":
            body["return_tokens_as_token_ids"] = True
        else:
            body.pop("prompt_logprobs", None)  # vLLM's extension
        answer = self.call("/v1/completions", body)
        try:
            choice = answer["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise EndpointError(f"{self.root}/v1/completions answered without choices") from None
        prompt_ids = (self.tokenize(request.prompt) or []) if isinstance(request.prompt, str) else list(request.prompt)
        ids, positions = self._positions(choice.get("logprobs"), choice.get("text", ""))
        cached = ((answer.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
        prompt_positions = None
        if request.prompt_logprobs is not None and choice.get("prompt_logprobs") is not None:
            prompt_positions = [position(t, d) for t, d in zip(prompt_ids, choice["prompt_logprobs"], strict=False)]
        return Response(
            prompt_ids, ids, positions, choice.get("finish_reason"), choice.get("text", ""), prompt_positions, cached
        )

    def complete_many(self, requests: Sequence[Request], concurrency: int) -> list[Response]:
        """``requests`` from a pool of ``concurrency`` threads (results in request order)."""
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            return list(pool.map(self.complete, requests))

    def _token_id(self, key: str) -> int | None:
        if key.startswith("token_id:"):
            return int(key[len("token_id:") :])
        return self.pieces.get(key)

    def _positions(self, logprobs: Any, text: str) -> tuple[list[int], list[Position]]:
        """Generated ids and positions from a legacy ``logprobs`` object (ids from ``token_id:N`` keys, or text
        pieces mapped through ``pieces``; a piece that maps to no single id ends the comparable positions)."""
        if not logprobs or not logprobs.get("tokens"):
            return [], []
        ids: list[int] = []
        positions = []
        tops = logprobs.get("top_logprobs") or [None] * len(logprobs["tokens"])
        for key, lp, top in zip(logprobs["tokens"], logprobs.get("token_logprobs") or [], tops, strict=False):
            tok = self._token_id(str(key))
            if tok is None:
                break  # unknown from here on: the ids after it cannot be placed
            entries = {t: float(v) for k, v in (top or {}).items() if (t := self._token_id(str(k))) is not None}
            ids.append(tok)
            positions.append(Position(tok, None if lp is None else float(lp), entries))
        return ids, positions

    # ---- extras ----------------------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int] | None:
        """The server's own tokenization of a prompt (``/tokenize`` or ``/extras/tokenize``), None without one."""
        if self.server == "vllm":
            return self._ids("/tokenize", {"model": self.model_name, "prompt": text})
        return self._ids("/extras/tokenize", {"input": text}) if self.server == "llama-cpp-python" else None

    def reset_cache(self) -> bool:
        """A server's cache cannot be emptied from outside."""
        return False

    def chat_ids(self, messages: Sequence[dict[str, str]]) -> list[int] | None:
        """The prompt ids vLLM's chat template builds (``/tokenize`` with ``messages``); None elsewhere."""
        body = {"model": self.model_name, "messages": list(messages), "add_generation_prompt": True}
        return self._ids("/tokenize", body) if self.server == "vllm" else None

    def _ids(self, path: str, body: dict[str, Any]) -> list[int] | None:
        answer = self.call(path, body, optional=True)
        return None if answer is None else [int(t) for t in answer["tokens"]]


def completion_fields(request: Request) -> dict[str, Any]:
    """A request's fields as the OpenAI completions API and vLLM's ``SamplingParams`` both name them (a ban is a
    logit bias of -100; unset ones left out)."""
    s, bans = request.api_sampler(), request.sampler.ban_ids
    out: dict[str, Any] = dict(max_tokens=request.max_tokens, temperature=s["temperature"], top_p=s["top_p"])
    out.update(logprobs=request.logprobs, top_k=s["top_k"] or None, seed=s["seed"], stop=list(request.stop) or None)
    out.update(logit_bias={int(t): -100.0 for t in bans} or None, prompt_logprobs=request.prompt_logprobs)
    return {k: v for k, v in out.items() if v is not None}


def piece_table(model: Model) -> dict[str, int]:
    """Each token's text → its id in ``model``'s tokenizer, for the pieces exactly one id has (what maps text-keyed
    log-probs back)."""
    seen: dict[str, list[int]] = {}
    tok: Any = model.tokenizer  # a transformers tokenizer (``hf``) or genprobe's own
    for i in range(len(tok.hf) if hasattr(tok, "hf") else tok.vocab_size):
        seen.setdefault(tok.token_str(i) if hasattr(tok, "token_str") else model.decode([i]), []).append(i)
    return {s: ids[0] for s, ids in seen.items() if len(ids) == 1}


def position(token: int, top: Mapping[Any, Any] | None) -> Position | None:
    """One position of vLLM's top-k ``{id: logprob}`` (``Logprob`` objects in process, ``{"logprob": x}`` over HTTP;
    the actual token among them), None where nothing was returned."""
    if not top:
        return None
    lps = {int(i): float(v["logprob"] if isinstance(v, Mapping) else v.logprob) for i, v in top.items()}
    return Position(int(token), lps.get(int(token)), lps)
