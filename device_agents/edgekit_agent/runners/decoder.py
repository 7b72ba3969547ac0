"""The decoder contract: a causal language model with a KV cache on one runtime (the generation workload,
``generation.py``). A decoder is a runner of its runtime (it loads like one: threads, options, the runtime's
errors) that also answers ``forward(ids, start)``: the logits of ``ids`` placed at positions
``start...start+len(ids)-1`` of the sequence its cache holds. ``start == 0`` begins a new sequence;
any other ``start`` must equal the number of tokens the cache holds (a decoder never guesses)."""

from __future__ import annotations

from typing import Any, ClassVar, Sequence

from ..protocol import EXIT_BAD_REQUEST, AgentFailure
from .base import Runner


class Decoder(Runner):
    #: the positions a cache holds at most (a static cache's size); None: bounded by the model only
    context: int | None = None
    length: int = 0  # tokens in the cache now
    kv_source: ClassVar[str] = ""  # where kv_cache_bytes() comes from (or why it cannot say)

    def forward(self, ids: Sequence[int], start: int) -> Any:
        """Float32 logits [len(ids), vocab] (a numpy array) of ``ids`` at ``start``..., the cache updated."""
        raise NotImplementedError

    def kv_cache_bytes(self) -> int | None:
        """The bytes the runtime holds for the KV cache now; None where the runtime does not tell."""
        return None

    def check_position(self, n: int, start: int) -> None:
        """``start`` continues the cached sequence (or begins one) and the tokens fit the context."""
        if n < 1:
            raise AgentFailure("bad_request", "a forward needs at least one token", EXIT_BAD_REQUEST)
        if start not in (0, self.length):
            raise AgentFailure(
                "bad_request",
                f"position {start} does not continue the cached sequence of {self.length} tokens",
                EXIT_BAD_REQUEST,
            )
        if self.context is not None and start + n > self.context:
            raise AgentFailure(
                "bad_request",
                f"{start + n} positions exceed the model file's context of {self.context} (its static KV cache)",
                EXIT_BAD_REQUEST,
            )
