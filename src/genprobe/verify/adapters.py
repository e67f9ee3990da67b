"""The adapter protocol that lets the verifier drive *any* KV-cache implementation, plus built-ins.

An implementation under test has ``reset()``, ``prefill(ids, attention_mask=None)`` and ``step(ids)`` (no base class
needed; :class:`CacheImpl`), the reference ``full(ids, attention_mask=None)`` (:class:`Reference`); either may expose
``max_positions``, an implementation ``prefill_starts_sequence = True``. What each call must do: docs/verify-cache.md
("The adapter protocol").
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable, Protocol, cast, runtime_checkable

import torch

from ..engine.cache import KVCache
from ..engine.fast.static_cache import StaticKVCache
from ..engine.runner import forward_step, runner_for
from ..model.gpt import GPT
from ..model.load import max_positions
from ..model.position_lm import PositionDrivenLM, default_positions
from .hf_caches import make_cache, unavailable_reason


@runtime_checkable
class CacheImpl(Protocol):
    """A cached implementation under test (see the module docstring)."""

    def reset(self) -> None: ...

    def prefill(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor: ...

    def step(self, ids: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class Reference(Protocol):
    """Full recomputation without a cache: the ground truth."""

    def full(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor: ...


class ImplSpecError(ValueError):
    """A ``--impl`` specification that cannot be imported or does not yield an adapter."""


class ImplFactoryError(Exception):
    """The user's factory raised while building the implementation (a crash of the implementation, not bad input)."""

    def __init__(self, spec: str, exc: BaseException):
        super().__init__(f"factory {spec!r} raised {type(exc).__name__}: {exc}")
        self.spec, self.exc = spec, exc


# ---- the reference and our engine ------------------------------------------------------------------
def window_visibility(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int, sinks: int = 0) -> torch.Tensor:
    """(B, Tq, Tk) bool: causal, within the last ``window`` positions, or one of the first ``sinks``."""
    dist = q_pos[:, :, None] - k_pos[:, None, :]
    return (dist >= 0) & ((dist < window) | (k_pos[:, None, :] < sinks))


@torch.no_grad()
def windowed_forward(
    model: GPT, ids: torch.Tensor, window: int, sinks: int = 0, attention_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Logits (B, T, V) of ``model`` under a sliding window (+ sinks) in every layer, no cache: the windowed reference.

    A query at position q sees a key at position k iff k ≤ q and (q − k < W or k < S) (Mistral's sliding window,
    transformers ``masking_utils.sliding_window_overlay``; sinks as in StreamingLLM, Xiao et al. 2023). Positions count
    real tokens: under left padding the sinks are a row's first S real tokens. The mask applies in every layer, so a
    key's hidden state is the one computed with its own window, as a cache holds it (recomputing the visible tokens
    alone would be another, wrong reference for a model of more than one layer)."""
    B, T = ids.shape
    valid = None if attention_mask is None else attention_mask.to(torch.bool)
    positions = default_positions(B, T, None, attention_mask, ids.device)
    model.check_positions(positions)
    model.check_ids(ids)
    vis = window_visibility(positions, positions, window, sinks)
    if valid is not None:
        vis = vis & valid[:, None, :]
        vis = vis | ~vis.any(-1, keepdim=True)  # a padding query that sees nothing: any output, never compared
    mask = vis[:, None]
    if model.alibi_slopes is not None:
        dist = (positions[:, None, :, None] - positions[:, None, None, :]).to(torch.float32)
        bias = -model.alibi_slopes.view(1, -1, 1, 1) * dist.clamp(min=0)
        dtype = model.wte.weight.dtype
        blocked = torch.zeros(mask.shape, dtype=dtype, device=ids.device).masked_fill(~mask, float("-inf"))
        mask = blocked + bias.to(dtype)
    x = model.wte(ids)
    if model.wpe is not None:
        x = x + model.wpe(positions)
    for block in model.h:
        x = block(x, positions, mask, None, None)
    logits: torch.Tensor = model.lm_head(model.ln_f(x))
    return logits


class FullRecompute:
    """Reference: one uncached forward over the whole sequence through the model's runner (``runner_for``: our GPT,
    or a ``transformers`` causal LM with positions counted from the mask) — for our GPT under a sliding window of
    ``window`` positions and ``sinks`` sinks when ``window`` is given (:func:`windowed_forward`)."""

    name = "reference"

    def __init__(self, model: torch.nn.Module, window: int | None = None, sinks: int = 0):
        if window is not None and (window < 1 or sinks < 0):
            raise ValueError(f"window must be >= 1 and sinks >= 0, got {window} and {sinks}")
        self.model, self.window, self.sinks = model.eval(), window, sinks
        self.runner = runner_for(model)
        self.max_positions = self.runner.max_positions
        if window is not None:
            self.description = f"windowed recomputation (window {window}, sinks {sinks})"

    @torch.no_grad()
    def full(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of every position, recomputed from scratch (under the window)."""
        if self.window is not None:
            return windowed_forward(cast(GPT, self.model), ids, self.window, self.sinks, attention_mask)
        if attention_mask is None and not isinstance(self.model, GPT):  # our GPT's unmasked forward is its own path
            attention_mask = torch.ones_like(ids)
        return self.runner.full(ids, cast(torch.Tensor, attention_mask)).float()


class EngineAdapter:
    """genprobe's own engine: preallocated ``KVCache`` + ``forward_step``, optionally a sliding window + sinks (a ring
    buffer of ``sinks + window`` slots that, once full, takes one token per call: the adapter then feeds a chunk
    token by token, since a chunk would overwrite keys its own first queries still need)."""

    def __init__(self, model: GPT, window: int | None = None, sinks: int = 0):
        self.model: PositionDrivenLM = model.eval()
        self.window, self.sinks = window, sinks
        self.capacity = None if window is None else sinks + window
        self.max_len = self.capacity or model.cfg.block_size
        learned = model.cfg.max_positions
        # Without a window the cache holds max_len tokens: a longer sequence is the adapter's limit too
        # (a ring buffer takes any length, bounded only by a learned position table).
        self.max_positions = learned if self.capacity is not None else min(self.max_len, learned or self.max_len)
        self.name = "engine" if window is None else f"engine (window {window}, sinks {sinks})"
        self.prefill_starts_sequence = True  # prefill() allocates a fresh cache
        self.cache: Any = None  # KVCache (StaticKVCache for the compiled path)
        self.fed = 0  # tokens written into the cache (padding included)

    def reset(self) -> None:
        """Drop the cache; the next ``prefill`` allocates one for its batch size."""
        self.cache = None
        self.fed = 0

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        self.cache, self.fed = self._new_cache(ids.shape[0]), 0
        return self._feed(ids, attention_mask)

    @torch.no_grad()
    def step(self, ids: torch.Tensor) -> torch.Tensor:
        if self.cache is None:
            raise RuntimeError("step() before prefill()")
        return self._feed(ids, None)

    def _new_cache(self, batch_size: int) -> Any:
        kw = {} if self.window is None else {"window": self.window, "sinks": self.sinks}
        return KVCache.for_model(self.model.cfg, batch_size, max_len=self.max_len, **kw)

    def _feed(self, ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        outs, start, T = [], 0, ids.shape[1]
        while start < T:
            # a full ring buffer takes one token per call; before that, as many as still fit
            n = T - start if self.capacity is None else max(1, min(T - start, self.capacity - self.fed))
            piece_mask = None if mask is None else mask[:, start : start + n]
            piece = ids[:, start : start + n]
            outs.append(forward_step(cast(GPT, self.model), piece, cache=self.cache, attention_mask=piece_mask))
            self.fed += n
            start += n
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


class CompiledEngineAdapter(EngineAdapter):
    """genprobe's compiled decode path: ``StaticKVCache``, single-token steps through ``torch.compile`` (a chunk eagerly
    through the same cache) — of our GPT or of a Llama-family ``transformers`` model
    (:class:`~genprobe.model.llama_family.LlamaFamily` over its weights)."""

    def __init__(self, model: PositionDrivenLM):
        from ..engine.fast.compiled import CompiledGPTRunner

        model.training = False  # its own flag only (a Llama-family view's submodules are the user's model's)
        self.model, self.runner, self.name = model, CompiledGPTRunner(model), "engine-compiled"
        # A static cache holds its capacity in every step's attention: a long-context model's whole context
        # (SmolLM2: 8,192) would make each step read 8k slots. The verifier's sequences are short: 1,024 at most.
        self.max_len = min(model.cfg.block_size, 1024)
        self.max_positions, self.capacity, self.prefill_starts_sequence = model.cfg.max_positions, None, True
        self.reset()

    @torch.inference_mode()
    def _new_cache(self, batch_size: int) -> StaticKVCache:
        return self.runner.new_state(batch_size, self.max_len)

    @torch.inference_mode()
    def _feed(self, ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        valid = None if mask is None else mask.to(torch.bool)
        return self.runner.step(ids, valid, self.cache).clone()


# ---- transformers causal LMs -----------------------------------------------------------------------
class HFAdapter:
    """A ``transformers`` causal LM driven through its own cache: a fresh one of class ``cache``
    (:mod:`genprobe.verify.hf_caches`; ``max_cache_len`` sizes a static one) per sequence, or the model's default.

    ``pass_position_ids=True`` passes per-row positions counted from the attention mask, as ``generate()`` does;
    with ``False`` the model falls back to ``cache length + arange(T)``, shifting the shorter rows of a left-padded
    batch — the classic GPT-2 batched-generation bug (RoPE is immune to a constant shift).
    """

    def __init__(
        self,
        hf_model: torch.nn.Module,
        pass_position_ids: bool = True,
        cache: str | None = None,
        max_cache_len: int | None = None,
    ):
        self.hf = hf_model.eval()
        self.pass_position_ids = pass_position_ids
        self.prefill_starts_sequence = True  # prefill() resets and builds a fresh cache
        self.cache_kind = cache
        why = None if cache is None else unavailable_reason(hf_model, cache)
        if why is not None:
            raise CacheUnavailableError(f"cache {cache!r} is unavailable: {why}")
        self.max_positions = max_positions(hf_model)
        self.max_cache_len = max_cache_len or self.max_positions or 2048
        arch = getattr(hf_model.config, "model_type", "model")
        self.name = f"hf:{arch}" + (f"[{cache}]" if cache else "") + ("" if pass_position_ids else "-no-position-ids")
        # transformers v5 renamed ``past_key_values`` to ``cache``: whichever forward accepts
        self._kw = "cache" if "cache" in inspect.signature(hf_model.forward).parameters else "past_key_values"
        self.reset()

    def reset(self) -> None:
        self.cache: Any = None  # a transformers Cache, whichever class the kind builds
        self.mask: torch.Tensor | None = None
        self.next_pos: torch.Tensor | None = None

    @torch.no_grad()
    def _call(self, ids: torch.Tensor, new_mask: torch.Tensor) -> torch.Tensor:
        assert self.next_pos is not None  # prefill() sets it before any call
        self.mask = new_mask if self.mask is None else torch.cat([self.mask, new_mask], dim=1)
        kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": self.mask, "use_cache": True}
        if self.cache is not None:
            kwargs[self._kw] = self.cache
        if self.pass_position_ids:
            B, T = ids.shape
            kwargs["position_ids"] = self.next_pos[:, None] + default_positions(B, T, None, new_mask, ids.device)
        out = self.hf(**kwargs)
        self.cache = next((out[k] for k in ("cache", "past_key_values") if out.get(k) is not None), None)
        if self.cache is None:
            raise RuntimeError("the model returned no cache although use_cache=True")
        self.next_pos = self.next_pos + new_mask.long().sum(1)
        logits: torch.Tensor = out.logits.float()
        return logits

    def prefill(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Run the prompt with ``use_cache=True`` into a fresh cache and keep it."""
        self.reset()
        if self.cache_kind is not None:
            self.cache = make_cache(self.hf, self.cache_kind, ids.shape[0], self.max_cache_len)
        self.next_pos = torch.zeros(ids.shape[0], dtype=torch.long, device=ids.device)
        mask = torch.ones_like(ids) if attention_mask is None else attention_mask.long()
        return self._call(ids, mask)

    def step(self, ids: torch.Tensor) -> torch.Tensor:
        if self.next_pos is None:
            raise RuntimeError("step() before prefill()")
        return self._call(ids, torch.ones_like(ids))


class CacheUnavailableError(ValueError):
    """A ``transformers`` cache class that the installed version (or this machine) cannot provide."""


# ---- user implementations --------------------------------------------------------------------------
def check_impl(obj: Any, what: str = "implementation") -> None:
    """Raise ImplSpecError unless ``obj`` has callable ``reset``, ``prefill`` and ``step``."""
    missing = [m for m in ("reset", "prefill", "step") if not callable(getattr(obj, m, None))]
    if missing:
        raise ImplSpecError(
            f"{what} of type {type(obj).__name__} lacks {', '.join(missing)}(): an implementation needs "
            "reset(), prefill(ids, attention_mask=None) and step(ids) (see genprobe.verify.adapters)"
        )


def import_factory(spec: str) -> Callable[..., Any]:
    """The callable ``"pkg.module:factory"`` names, imported (ImplSpecError otherwise); not called."""
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ImplSpecError(f"an implementation spec is 'package.module:factory', got {spec!r}")
    mod_name, attr = spec.split(":")
    try:
        module = importlib.import_module(mod_name)
    except Exception as exc:  # noqa: BLE001 — the user's module failing on import is bad input, reported
        raise ImplSpecError(f"cannot import module {mod_name!r} of implementation {spec!r}: {exc}") from None
    factory: Callable[..., Any] | None = getattr(module, attr, None)
    if not callable(factory):
        missing = f"module {mod_name!r} has no attribute {attr!r} (implementation {spec!r})"
        raise ImplSpecError(missing if factory is None else f"{spec!r} is not callable")
    return factory


def load_impl(spec: str, model: Any = None) -> Any:
    """Import ``"pkg.module:factory"`` and return ``factory(model)`` (or ``factory()``), checked."""
    factory = import_factory(spec)
    try:
        params = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):  # builtins without a signature: called with no argument
        params = []
    params = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    n_required = sum(1 for p in params if p.default is inspect.Parameter.empty)
    if n_required > 1:
        raise ImplSpecError(f"factory {spec!r} must take at most one argument (the model), it requires {n_required}")
    if n_required == 1 and model is None:
        raise ImplSpecError(f"factory {spec!r} needs a model: give the model (checkpoint or transformers directory)")
    try:
        impl = factory(model) if params and model is not None else factory()
    except Exception as exc:  # noqa: BLE001 — the implementation's own failure: reported, not a usage error
        raise ImplFactoryError(spec, exc) from exc
    check_impl(impl, f"{spec!r} returned an object that")
    return impl
