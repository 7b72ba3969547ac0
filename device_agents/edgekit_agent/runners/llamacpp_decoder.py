"""llama.cpp as a decoder: a GGUF file on llama-cpp-python's low-level API (ctypes over libllama), the KV
cache held by llama.cpp in its context (one sequence, ``generate.context`` positions).

One ``llama_decode`` a forward, with a batch that asks for the logits of every position (the scoring workload
needs them all, a decode step has one); ``llama_get_logits`` then holds ``[n, vocab]`` floats, copied out.
``start == 0`` clears the context's memory (``llama_memory_clear``: llama-cpp-python 0.3.36 has the memory API;
the old ``llama_kv_self_*`` calls are gone). A prompt longer than a batch is decoded in slices of ``n_batch``.

Runtime option ``kv_type``: the cache's element type (llama.cpp's default f16; f32 for a reference run;
q8_0, which needs flash attention, on by default where the backend has it)."""

from __future__ import annotations

import weakref
from typing import Any, Sequence

from ..protocol import EXIT_BAD_REQUEST, EXIT_RUNTIME, AgentFailure, Doc
from .base import dist_version
from .decoder import Decoder
from .llamacpp_runner import DIST, KV_TYPES, LOG, LlamaCppRunner, import_llama_cpp


def _free(lc: Any, batch: Any, ctx: Any, model: Any) -> None:
    if batch is not None:
        lc.llama_batch_free(batch)
    if ctx:
        lc.llama_free(ctx)
    if model:
        lc.llama_model_free(model)


class LlamaCppDecoder(Decoder, LlamaCppRunner):
    kv_source = (
        "llama.cpp: llama_state_seq_get_size of the sequence (the K and V of the cells it holds, at the "
        "cache's type, plus a few bytes of cell metadata; the context's buffers are allocated for the "
        "whole context at load)"
    )

    def load(self, model_path: str, request: Doc) -> None:
        import numpy as np

        context = (request.get("generate") or {}).get("context")
        if not isinstance(context, int) or context < 1:
            raise AgentFailure(
                "bad_request", "a llama.cpp decoder needs generate.context (its KV cache size)", EXIT_BAD_REQUEST
            )
        opts = self.check_options(request.get("runtime_options"))
        kv_type = str(opts.get("kv_type", "f16"))
        threads = int(request.get("threads", 1))
        lc = import_llama_cpp()
        self.lc = lc
        self.version = dist_version(DIST)
        lc.llama_backend_init()
        mp = lc.llama_model_default_params()
        mp.n_gpu_layers = 0
        LOG.clear()
        model = lc.llama_model_load_from_file(model_path.encode(), mp)
        if not model:
            raise AgentFailure("model_load_failed", f"llama.cpp cannot load {model_path}: {LOG.reason()}", EXIT_RUNTIME)
        cp = lc.llama_context_default_params()
        cp.n_ctx = context
        cp.n_batch = cp.n_ubatch = min(context, 512)  # one ubatch a prefill of up to 512 tokens
        cp.n_seq_max = 1
        cp.n_threads = cp.n_threads_batch = threads
        cp.type_k = cp.type_v = KV_TYPES[kv_type]
        cp.no_perf = True
        LOG.clear()
        ctx = lc.llama_init_from_model(model, cp)
        if not ctx:
            lc.llama_model_free(model)
            raise AgentFailure(
                "model_load_failed",
                f"llama.cpp cannot make a context of {context} positions for "
                f"{model_path} (kv_type {kv_type}): {LOG.reason()}",
                EXIT_RUNTIME,
            )
        self.n_batch = int(lc.llama_n_batch(ctx))
        batch = lc.llama_batch_init(self.n_batch, 0, 1)
        self._finalizer = weakref.finalize(self, _free, lc, batch, ctx, model)
        self.model, self.ctx, self.batch = model, ctx, batch
        self.n_vocab = int(lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model)))
        self.memory = lc.llama_get_memory(ctx)
        # numpy views of the batch's arrays; the sequence ids and the logits flags never change
        self.tokens = np.ctypeslib.as_array(batch.token, shape=(self.n_batch,))
        self.pos = np.ctypeslib.as_array(batch.pos, shape=(self.n_batch,))
        np.ctypeslib.as_array(batch.n_seq_id, shape=(self.n_batch,))[:] = 1
        np.ctypeslib.as_array(batch.logits, shape=(self.n_batch,))[:] = 1  # every position's logits
        for i in range(self.n_batch):
            batch.seq_id[i][0] = 0
        self.layers = int(lc.llama_model_n_layer(model))
        self.train_context = int(lc.llama_model_n_ctx_train(model))
        self.context, self.length, self.threads = context, 0, threads
        self.options = {"kv_type": kv_type}
        if context > self.train_context > 0:
            self.warnings.append(f"context {context} exceeds the model's training context {self.train_context}")

    def forward(self, ids: Sequence[int], start: int) -> Any:
        import numpy as np

        n = len(ids)
        self.check_position(n, start)
        lc = self.lc
        if start == 0:
            lc.llama_memory_clear(self.memory, False)  # the cells' metadata: their data is overwritten
            self.length = 0
        out = np.empty((n, self.n_vocab), np.float32)
        for a in range(0, n, self.n_batch):
            m = min(self.n_batch, n - a)
            self.tokens[:m] = ids[a : a + m]
            self.pos[:m] = np.arange(start + a, start + a + m)
            self.batch.n_tokens = m
            rc = int(lc.llama_decode(self.ctx, self.batch))
            if rc != 0:
                self.length = 0  # llama.cpp may keep part of a failed batch: the next forward must start anew
                raise AgentFailure(
                    "inference_failed",
                    f"llama_decode returned {rc} at positions {start + a}.."
                    f"{start + a + m - 1} ({'no free KV cache slot' if rc == 1 else 'an error'})",
                    EXIT_RUNTIME,
                )
            out[a : a + m] = np.ctypeslib.as_array(lc.llama_get_logits(self.ctx), shape=(m, self.n_vocab))
            self.length = start + a + m
        return out

    def kv_cache_bytes(self) -> int | None:
        return int(self.lc.llama_state_seq_get_size(self.ctx, 0))
