"""rl360's CPU inference engine: continuous batching of a Hugging Face causal LM with a KV cache.

One scheduler thread owns the model. Requests arrive through `submit()` from
any thread and wait in a queue; when the engine is idle the first arrival
waits up to `max_wait_ms` for company (up to `max_batch_size`), then the
group is prefilled together and joins the running batch, which decodes one
token per step for every row. Requests that arrive while a batch runs join
at the next step. A prompt that begins with tokens the engine computed
before (the agent's previous turn, a sibling sample's prompt) continues from
their cached keys and values (prefix_cache.py); identical prompts admitted
together are prefilled once. Control commands (pause, flush, weight loads) run on the
same thread between steps, so they never race a forward pass; HTTP stays
responsive because torch releases the GIL while it computes.

With `static_kv` the running batch's keys and values live in fixed buffers instead (static_kv.py): the
decode step has one shape per batch bucket and, on CUDA, is captured once per bucket as a CUDA graph and
replayed; prefill stays as it is. The default is the dynamic cache (kv.py).

Pause modes follow SGLang: `abort` ends every request (finish reason abort),
`retract` drops the running rows' KV cache and re-queues them (their prompt
and tokens so far are prefilled again, under whatever weights are loaded
when they resume), `in_place` keeps everything as it is.

    engine = Engine.load("path/to/model", max_batch_size=32, max_wait_ms=5)   # device="cuda" on a GPU
    engine.start()
    answer = engine.submit(item).result()      # SGLang's {"text", "output_ids", "meta_info"}

Tested by tests/inference/test_engine.py (directly) and test_server.py (over HTTP).
"""

from __future__ import annotations

import collections
import concurrent.futures
import inspect
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rl360cli.inference import protocol
from rl360cli.inference.config import DEFAULT_PREFIX_CACHE_MB
from rl360cli.inference.kv import BatchKV, left_padded
from rl360cli.inference.prefix_cache import Layers, PrefixCache
from rl360cli.inference.protocol import GenerateItem, ProtocolError
from rl360cli.inference.sampling import sample_next
from rl360cli.inference.static_kv import CudaGraphs, StaticKV, decode_buckets

log = logging.getLogger("rl360.engine")


@dataclass(eq=False)
class _Seq:
    item: GenerateItem
    prompt: list[int]
    future: concurrent.futures.Future
    created: float
    generator: torch.Generator | None
    stop_ids: frozenset[int]
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    input_logprobs: list[float | None] | None = None
    # Where the scan for stop strings resumes (in characters of the decoded output).
    finish: dict | None = None
    stop_text_end: int | None = None
    # Prompt tokens whose keys and values came from the prefix cache (SGLang's `cached_tokens`).
    cached_tokens: int = 0
    # The engine's weight loads when this row was prefilled: a row that ran on through a load holds
    # keys and values of two policies, which the prefix cache must not keep.
    weights_loaded: int = 0

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output


class Engine:
    """The scheduler thread, the model and the queue in front of them."""

    def __init__(self, model: Any, tokenizer: Any, *, model_path: str, max_batch_size: int = 32,
                 max_wait_ms: float = 5.0, weight_version: str = "0", seed: int = 0, device: str = "cpu",
                 prefix_cache_mb: float = DEFAULT_PREFIX_CACHE_MB, static_kv: bool = False,
                 cuda_graphs: bool | None = None):
        # The model, its KV cache, every step's inputs and the sampling all live on `device`; only the
        # chosen token ids and their logprobs come back to the host, once per step.
        self.device = torch.device(device)
        if self.device.type == "cuda":
            # cuDNN's attention plans a graph for each new key length, i.e. for every decode step: on an
            # H200 (torch 2.11) 1.36 ms of host time a layer, 37 ms of a 28-layer model's 69 ms step, the
            # GPU idle meanwhile. Flash and memory-efficient attention plan nothing. Process-wide: the
            # engine owns its server's process.
            torch.backends.cuda.enable_cudnn_sdp(False)
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.model_path = model_path
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1000
        self.weight_version = str(weight_version)
        self.config = model.config
        self.context_length = int(getattr(self.config, "max_position_embeddings", 0) or 1 << 30)
        self.eos_ids = _eos_ids(model, tokenizer)
        self.pad_id = _pad_id(model, tokenizer, self.eos_ids)
        self._cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        _check_plain_cache(self.config)
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        self._lock = threading.Condition()
        self._incoming: collections.deque[_Seq] = collections.deque()
        self._commands: collections.deque[tuple[Callable[[], Any], concurrent.futures.Future]] = collections.deque()
        self._waiting: collections.deque[_Seq] = collections.deque()
        self._running: list[_Seq] = []
        self._kv: BatchKV | StaticKV | None = None
        # The static cache (buffers and captured steps) outlives batches; `_kv` is it while rows run.
        self.static_kv = static_kv
        self.cuda_graphs = static_kv and (self.device.type == "cuda" if cuda_graphs is None else cuda_graphs)
        if self.cuda_graphs and self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device (the engine's is {self.device})")
        self._static: StaticKV | None = None
        self.prefix_cache = PrefixCache(int(prefix_cache_mb * (1 << 20))) if prefix_cache_mb > 0 else None
        self.weight_loads = 0
        self._paused = False
        self.released_weights = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.last_beat = time.monotonic()
        self.num_generated_tokens = 0
        self.num_finished_requests = 0
        self.num_forward_steps = 0
        self.failure: BaseException | None = None

    # ------------------------------------------------------------------ construction

    @classmethod
    def load(cls, model_path: str | Path, *, dtype: str = "float32", **kwargs: Any) -> Engine:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = str(model_path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError):
            tokenizer = None  # input_ids only, and no `text` in answers (SGLang's skip_tokenizer_init)
        return cls(model, tokenizer, model_path=path, **kwargs)

    # ------------------------------------------------------------------ public, any thread

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name="rl360-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.failure is None

    @property
    def paused(self) -> bool:
        return self._paused

    def load_info(self) -> dict[str, int]:
        with self._lock:
            waiting = len(self._waiting) + len(self._incoming)
        return {"num_running_reqs": len(self._running), "num_waiting_reqs": waiting,
                "num_tokens": sum(len(s.prompt) + len(s.output) for s in list(self._running))}

    def submit(self, item: GenerateItem) -> concurrent.futures.Future:
        """Queue one prompt; the future resolves to SGLang's answer dict. Bad input raises ProtocolError now."""
        prompt = self._prompt_ids(item)
        if len(prompt) >= self.context_length:
            raise ProtocolError(f"the prompt has {len(prompt)} tokens; the context length is {self.context_length}")
        for tid in (*prompt, *item.params.stop_token_ids):
            if tid >= self.config.vocab_size:
                raise ProtocolError(f"token id {tid} is outside the vocabulary ({self.config.vocab_size})")
        stop_ids = set(item.params.stop_token_ids)
        if not item.params.ignore_eos:
            stop_ids |= self.eos_ids
        gen = None
        if item.params.sampling_seed is not None:
            gen = torch.Generator(device=self.device).manual_seed(item.params.sampling_seed)
        seq = _Seq(item=item, prompt=prompt, future=concurrent.futures.Future(), created=time.time(),
                   generator=gen, stop_ids=frozenset(stop_ids))
        with self._lock:
            if self._stopping or self.failure is not None:
                raise RuntimeError("the engine is not running")
            self._incoming.append(seq)
            self._lock.notify_all()
        return seq.future

    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Run `fn()` on the engine thread between two steps (even while paused)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            self._commands.append((fn, future))
            self._lock.notify_all()
        return future

    # Commands; each runs on the engine thread through `call`.

    def pause(self, mode: str) -> int:
        """Stop stepping. Returns how many requests were aborted or retracted."""
        self._paused = True
        if mode == "abort":
            return self._abort_all("aborted by pause_generation")
        if mode == "retract":
            return self._retract_running()
        return 0

    def resume(self) -> None:
        self._paused = False

    def flush_cache(self) -> bool:
        """Drop the KV cache; refused (False) while rows hold KV, as SGLang refuses with requests running."""
        if self._running:
            return False
        self._kv = None
        self._clear_prefix_cache()
        return True

    def retract_and_flush(self) -> int:
        """Re-queue running rows and drop all KV: what comes next is computed from scratch."""
        n = self._retract_running()
        self._kv = None
        self._clear_prefix_cache()
        return n

    def release_memory(self, tags: tuple[str, ...]) -> int:
        """Give the device back while a colocated trainer steps: pause (running rows re-queued), drop the
        KV cache (`kv_cache`), move the weights to host memory (`weights`). Returns the rows re-queued."""
        self._paused = True
        n = self.retract_and_flush() if "kv_cache" in tags else self._retract_running()
        if "weights" in tags and self.device.type != "cpu":
            self.model.to("cpu")
            self.released_weights = True
        self._static = None  # its buffers, and graphs bound to parameters that may move
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return n

    def load_weights(self, named: list[tuple[str, torch.Tensor]]) -> None:
        """Copy `named` (name, tensor) into the model. The cached prefixes' keys and values are the old
        weights', so they go too."""
        from rl360cli.inference.weights import load_named

        load_named(self.model, named)
        self.weight_loads += 1
        self._clear_prefix_cache()

    def resume_memory(self, tags: tuple[str, ...]) -> None:
        """Undo `release_memory`: weights back on the device; generation continues (the KV cache refills)."""
        if "weights" in tags and self.released_weights:
            self.model.to(self.device)
            self.released_weights = False
        if not self.released_weights:
            self._paused = False

    def abort(self, rid: str | None, message: str = "aborted") -> int:
        if rid is None:
            return self._abort_all(message)
        n = 0
        with self._lock:
            for queue in (self._incoming, self._waiting):
                for seq in [s for s in queue if s.item.rid == rid]:
                    queue.remove(seq)
                    self._finish(seq, protocol.finish_abort(message))
                    n += 1
        doomed = [i for i, s in enumerate(self._running) if s.item.rid == rid]
        for i in doomed:
            self._finish(self._running[i], protocol.finish_abort(message))
            n += 1
        if doomed:
            self._drop_rows(set(doomed))
        return n

    # ------------------------------------------------------------------ the scheduler thread

    def _main(self) -> None:
        torch.set_grad_enabled(False)
        try:
            while True:
                self.last_beat = time.monotonic()
                with self._lock:
                    while self._incoming:
                        self._waiting.append(self._incoming.popleft())
                    if self._stopping:
                        break
                    commands = list(self._commands)
                    self._commands.clear()
                    if not commands and (self._paused or not (self._running or self._waiting)):
                        self._lock.wait(timeout=0.5)
                        continue
                if commands:
                    for fn, future in commands:
                        self._run_command(fn, future)
                    continue
                if not self._running and len(self._waiting) < self.max_batch_size:
                    # Idle engine: give the first arrival's companions up to max_wait to show up.
                    deadline = self._waiting[0].created + self.max_wait_s
                    if time.time() < deadline and self._wait_for_company(deadline):
                        continue
                self._step()
        except BaseException as e:  # noqa: BLE001 - a dead scheduler must fail every request, not hang them
            log.exception("engine thread failed")
            self.failure = e
            self._abort_all(f"engine failed: {e}")
        finally:
            self._abort_all("engine stopped")

    def _wait_for_company(self, deadline: float) -> bool:
        """Wait until the batch could be full or the deadline passes; True if something else needs a look."""
        with self._lock:
            while True:
                if self._commands or self._stopping:
                    return True
                if len(self._waiting) + len(self._incoming) >= self.max_batch_size:
                    return True
                remaining = deadline - time.time()
                if remaining <= 0:
                    return bool(self._incoming)
                self._lock.wait(timeout=remaining)

    def _run_command(self, fn: Callable[[], Any], future: concurrent.futures.Future) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn())
        except BaseException as e:  # noqa: BLE001 - the caller gets the exception
            future.set_exception(e)

    def _step(self) -> None:
        room = self.max_batch_size - len(self._running)
        admitted: list[_Seq] = []
        with self._lock:
            while room > 0 and self._waiting:
                seq = self._waiting.popleft()
                if seq.future.cancelled():
                    continue
                admitted.append(seq)
                room -= 1
        decoding = bool(self._running)
        if admitted:
            self._prefill(admitted)
        if decoding:
            self._decode()

    def _prefill(self, seqs: list[_Seq]) -> None:
        from transformers import DynamicCache

        want_prompt_logprobs = [s.item.return_logprob and s.item.logprob_start_len >= 0 and s.input_logprobs is None
                                for s in seqs]
        # Prompt logprobs need the logits of every prompt position: such a group is prefilled in full.
        reuse = self.prefix_cache is not None and not any(want_prompt_logprobs)
        rows, distinct = _distinct_rows([s.tokens for s in seqs])
        # At least the last token of each prompt is computed here: its logits choose the first new token.
        past = [self.prefix_cache.longest_prefix(tokens, at_most=len(tokens) - 1) if reuse else (0, [])
                for tokens in distinct]
        ids, mask, positions, past_layers = _prefill_inputs(distinct, past, self.pad_id)
        cache = DynamicCache(config=self.config)
        for index, (keys, values) in enumerate(past_layers):  # cached entries live on the device
            cache.update(keys, values, index)
        mask = mask.to(self.device)
        kwargs = {self._cache_kw: cache, "use_cache": True}
        if not any(want_prompt_logprobs):
            kwargs["logits_to_keep"] = 1
        logits = self.model(input_ids=ids.to(self.device), attention_mask=mask, position_ids=positions.to(self.device),
                            **kwargs).logits
        self.num_forward_steps += 1
        kv = BatchKV(cache=cache, mask=mask)
        if reuse:
            for d, tokens in enumerate(distinct):
                self.prefix_cache.insert(tokens, kv.row_layers(d))
        if len(distinct) < len(seqs):  # each row's copy of its prompt's keys, values and logits
            kv.select(rows)
            logits = logits[torch.tensor(rows, device=self.device)]
        for i, seq in enumerate(seqs):
            seq.cached_tokens = past[rows[i]][0]
            seq.weights_loaded = self.weight_loads
            if want_prompt_logprobs[i]:
                seq.input_logprobs = _prompt_logprobs(logits[i], seq.prompt, seq.item.logprob_start_len)
        finished = self._advance(seqs, logits[:, -1, :])
        keep = [i for i in range(len(seqs)) if i not in finished]
        if not keep:
            return
        if len(keep) < len(seqs):
            kv.select(keep)
        if self._kv is None or not self._running:
            self._kv = self._static_kv().adopt(kv) if self.static_kv else kv
        else:
            self._kv.join(kv)
        self._running.extend(seqs[i] for i in keep)

    def _decode(self) -> None:
        kv = self._kv
        if isinstance(kv, StaticKV):
            logits = kv.decode([s.output[-1] for s in self._running])
        else:
            ids = torch.tensor([[s.output[-1]] for s in self._running], dtype=torch.long, device=self.device)
            positions = kv.next_positions()
            mask = kv.grow_mask()
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                                **{self._cache_kw: kv.cache, "use_cache": True}).logits[:, -1, :]
            kv.mask = mask
        self.num_forward_steps += 1
        finished = self._advance(self._running, logits)
        if finished:
            self._cache_finished(finished)
            self._drop_rows(finished)

    def _static_kv(self) -> StaticKV:
        """The static cache, made on first use (and again after `release_memory` dropped it)."""
        if self._static is None:
            eager = getattr(self.config, "_attn_implementation", None) == "eager"
            self._static = StaticKV(self._static_forward, buckets=decode_buckets(self.max_batch_size),
                                    max_length=self.context_length, pad_id=self.pad_id, eager_mask=eager,
                                    graphs=CudaGraphs() if self.cuda_graphs else None)
        return self._static

    def _static_forward(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache: object
                        ) -> torch.Tensor:
        """The model's decode step over the static cache (what a CUDA graph captures): logits [b, 1, V]."""
        return self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                          **{self._cache_kw: cache}).logits

    def decode_info(self) -> dict[str, Any]:
        """How decode steps run: the static cache's state and its captured graphs (for /server_info, the GPU check)."""
        static = self._static
        return {"static_kv": self.static_kv, "cuda_graphs": self.cuda_graphs,
                "graphs_captured": static.captures if static else 0,
                "capture_error": static.capture_error if static else None,
                "slots": static.slots if static else 0, "capacity": static.capacity if static else 0}

    def _advance(self, seqs: list[_Seq], logits: torch.Tensor) -> set[int]:
        """Sample one token for each row; finish the rows that are done. Returns their indices."""
        done: set[int] = set()
        for i, seq in enumerate(seqs):
            if seq.future.cancelled():  # the client went away: stop spending steps on it
                done.add(i)
            elif seq.item.params.max_new_tokens == 0:
                done.add(i)
                self._finish(seq, protocol.finish_length(0))
        live = [i for i in range(len(seqs)) if i not in done]
        if not live:
            return done
        banned = [sorted(s.stop_ids) if len(s.output) < s.item.params.min_new_tokens else () for s in seqs]
        tokens, logprobs = sample_next(logits[live], [seqs[i].item.params for i in live],
                                       [seqs[i].generator for i in live], self._generator, [banned[i] for i in live])
        for j, i in enumerate(live):
            seq = seqs[i]
            seq.output.append(tokens[j])
            seq.logprobs.append(logprobs[j])
            self.num_generated_tokens += 1
            reason = self._finish_reason(seq)
            if reason is not None:
                done.add(i)
                self._finish(seq, reason)
        return done

    def _finish_reason(self, seq: _Seq) -> dict | None:
        p = seq.item.params
        token = seq.output[-1]
        if token in seq.stop_ids:  # stop ids cannot be drawn before min_new_tokens (see `banned`)
            return protocol.finish_stop(token)
        if p.stop and self.tokenizer is not None:
            text = self._decode_text(seq.output, p)
            tail_from = max(0, len(text) - max(len(s) for s in p.stop) - 8)
            hits = [(text.find(s, tail_from), s) for s in p.stop if text.find(s, tail_from) >= 0]
            if hits:
                at, matched = min(hits)
                seq.stop_text_end = at + (len(matched) if p.no_stop_trim else 0)
                return protocol.finish_stop(matched)
        if len(seq.output) >= p.max_new_tokens:
            return protocol.finish_length(p.max_new_tokens)
        if len(seq.prompt) + len(seq.output) >= self.context_length:
            return protocol.finish_length(len(seq.output))
        return None

    def _cache_finished(self, rows: set[int]) -> None:
        """Keep the keys and values of the running rows `rows` that ended normally (the agent's next
        turn starts with them): every token but the last sampled one, which was never fed forward.
        Not those of a row that went on through a weight load (an in-place update)."""
        if self.prefix_cache is None:
            return
        for i in rows:
            seq = self._running[i]
            if (seq.finish or {}).get("type") in ("stop", "length") and seq.weights_loaded == self.weight_loads:
                self.prefix_cache.insert(seq.tokens[:-1], self._kv.row_layers(i))

    def _clear_prefix_cache(self) -> None:
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    def _drop_rows(self, rows: set[int]) -> None:
        keep = [i for i in range(len(self._running)) if i not in rows]
        self._running = [self._running[i] for i in keep]
        if not keep:
            self._kv = None
        elif self._kv is not None:
            self._kv.select(keep)

    def _retract_running(self) -> int:
        seqs, self._running, self._kv = self._running, [], None
        with self._lock:
            # Back to the front of the queue, in their original order.
            self._waiting.extendleft(reversed(seqs))
        return len(seqs)

    def _abort_all(self, message: str) -> int:
        with self._lock:
            seqs = [*self._running, *self._waiting, *self._incoming]
            self._running, self._kv = [], None
            self._waiting.clear()
            self._incoming.clear()
        for seq in seqs:
            self._finish(seq, protocol.finish_abort(message))
        return len(seqs)

    # ------------------------------------------------------------------ answers

    def _finish(self, seq: _Seq, reason: dict) -> None:
        seq.finish = reason
        self.num_finished_requests += 1
        if seq.future.done():
            return
        try:
            seq.future.set_result(self._answer(seq))
        except concurrent.futures.InvalidStateError:
            pass  # cancelled by a client that went away

    def _answer(self, seq: _Seq) -> dict[str, Any]:
        item, reason = seq.item, seq.finish
        meta: dict[str, Any] = {
            "id": item.rid,
            "finish_reason": reason,
            "prompt_tokens": len(seq.prompt),
            "weight_version": self.weight_version,
            "completion_tokens": len(seq.output),
            "cached_tokens": seq.cached_tokens,
            "e2e_latency": time.time() - seq.created,
        }
        if item.return_logprob:
            texts = None
            if item.return_text_in_logprobs and self.tokenizer is not None:
                texts = [self.tokenizer.decode([t]) for t in seq.output]
            meta["output_token_logprobs"] = protocol.logprob_entries(seq.logprobs, seq.output, texts)
            prompt_part = seq.prompt[item.logprob_start_len:] if item.logprob_start_len >= 0 else []
            input_lps = seq.input_logprobs or []
            in_texts = None
            if item.return_text_in_logprobs and self.tokenizer is not None:
                in_texts = [self.tokenizer.decode([t]) for t in prompt_part]
            meta["input_token_logprobs"] = protocol.logprob_entries(input_lps, prompt_part, in_texts)
        answer: dict[str, Any] = {"output_ids": list(seq.output), "meta_info": meta}
        if self.tokenizer is not None:
            answer = {"text": self._answer_text(seq), **answer}
        return answer

    def _answer_text(self, seq: _Seq) -> str:
        p, reason = seq.item.params, seq.finish or {}
        ids = seq.output
        # As SGLang's detokenizer: a matched stop token is not part of the text (it stays in output_ids).
        if reason.get("type") == "stop" and isinstance(reason.get("matched"), int) and not p.no_stop_trim:
            ids = ids[:-1]
        text = self._decode_text(ids, p)
        return text if seq.stop_text_end is None else text[:seq.stop_text_end]

    def _decode_text(self, ids: list[int], p: protocol.SamplingParams) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=p.skip_special_tokens)

    def _prompt_ids(self, item: GenerateItem) -> list[int]:
        if item.input_ids is not None:
            return list(item.input_ids)
        if self.tokenizer is None:
            raise ProtocolError("this model has no tokenizer: send input_ids, not text")
        ids = self.tokenizer.encode(item.text, add_special_tokens=True)
        if not ids:
            raise ProtocolError("the text tokenizes to nothing")
        return list(ids)


def _distinct_rows(token_lists: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """Each row's index among the distinct token lists, and those lists (first seen first)."""
    index: dict[tuple[int, ...], int] = {}
    rows = [index.setdefault(tuple(tokens), len(index)) for tokens in token_lists]
    return rows, [list(tokens) for tokens in index]


def _prefill_inputs(prompts: list[list[int]], past: list[tuple[int, Layers]], pad_id: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Layers]:
    """A prefill's (input_ids, attention_mask, position_ids, past keys and values per layer) for
    `prompts` whose first `past[i][0]` tokens are cached (`past[i][1]`). The cached parts sit
    right-aligned in the first `width` columns, the tokens to compute right-aligned after them; the
    mask spans both, so a row may have padding between its cached part and the rest."""
    suffix_ids, suffix_mask, _ = left_padded([p[n:] for p, (n, _) in zip(prompts, past, strict=True)], pad_id)
    width = max(n for n, _ in past)
    past_mask = torch.zeros(len(prompts), width, dtype=torch.long)
    hits = [(row, n, cached) for row, (n, cached) in enumerate(past) if n]
    for row, n, _ in hits:
        past_mask[row, width - n:] = 1
    layers: Layers = []
    for index, (first_keys, _) in enumerate(hits[0][2] if hits else []):
        heads, _, head_dim = first_keys.shape
        keys = first_keys.new_zeros(len(prompts), heads, width, head_dim)
        values = torch.zeros_like(keys)
        for row, n, cached in hits:
            keys[row, :, width - n:], values[row, :, width - n:] = cached[index]
        layers.append((keys, values))
    mask = torch.cat([past_mask, suffix_mask], dim=1)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)[:, width:]
    return suffix_ids, mask, positions, layers


def _check_plain_cache(config: Any) -> None:
    """The batch KV cache pads and trims full-attention layers; sliding-window layers keep other state."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    kinds = {type(layer).__name__ for layer in DynamicCache(config=config).layers if type(layer) is not DynamicLayer}
    if kinds:
        raise ValueError(f"the local engine serves full-attention models only; this one has {', '.join(sorted(kinds))} "
                         "cache layers (sliding-window or linear attention): serve it with SGLang")


def _prompt_logprobs(logits: torch.Tensor, prompt: list[int], start: int) -> list[float | None]:
    """Logprob of each prompt token from position `start` on, given the ones before it (None for the first)."""
    # `logits` [T_padded, V] is right-aligned: the prompt's last token is the last row.
    offset = logits.shape[0] - len(prompt)
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    positions = list(range(max(start, 1), len(prompt)))
    rows = torch.tensor([offset + pos - 1 for pos in positions], dtype=torch.long, device=logits.device)
    ids = torch.tensor([prompt[pos] for pos in positions], dtype=torch.long, device=logits.device)
    values = logprobs[rows, ids].tolist() if positions else []  # one copy to the host
    first: list[float | None] = [None] if start == 0 and prompt else []  # the first token has no context
    return first + values


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, (list, tuple)):
            ids.update(int(e) for e in eos)
    if not ids and tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)


def _pad_id(model: Any, tokenizer: Any, eos: frozenset[int]) -> int:
    # Padding positions are masked out; any valid id will do.
    for value in (getattr(model.config, "pad_token_id", None), getattr(tokenizer, "pad_token_id", None)):
        if isinstance(value, int):
            return value
    return min(eos) if eos else 0
