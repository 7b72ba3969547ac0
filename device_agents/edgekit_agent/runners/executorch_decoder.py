"""ExecuTorch as a decoder: a ``.pte`` whose ``forward(input_ids [1, S], cache_position [S])`` returns the
logits [1, S, vocab] and keeps the KV cache in the program's own mutable buffers (a static cache of the
file's context, as transformers' and ExecuTorch's LLM exports write it). Writing at position 0 begins a new
sequence: the causal mask hides whatever a longer earlier sequence left in the buffers."""

from __future__ import annotations

from typing import Any, Sequence

from ..protocol import EXIT_BAD_REQUEST, AgentFailure, Doc
from .decoder import Decoder
from .executorch_runner import ExecuTorchRunner


class ExecuTorchDecoder(Decoder, ExecuTorchRunner):
    kv_source = (
        "executorch does not report it: the static cache lives in the program's memory plan "
        "(its size is the host's figure from the model's config)"
    )

    def load(self, model_path: str, request: Doc) -> None:
        ExecuTorchRunner.load(self, model_path, request)
        context = (request.get("generate") or {}).get("context")
        if not isinstance(context, int) or context < 1:
            raise AgentFailure(
                "bad_request", "an ExecuTorch decoder needs generate.context (its static cache size)", EXIT_BAD_REQUEST
            )
        self.context = context
        self.length = 0

    def forward(self, ids: Sequence[int], start: int) -> Any:
        import numpy as np

        n = len(ids)
        self.check_position(n, start)
        torch = self.torch
        out = self.method(
            [torch.tensor([list(ids)], dtype=torch.long), torch.arange(start, start + n, dtype=torch.long)]
        )
        self.length = start + n
        return np.asarray(out[0].numpy()[0], dtype=np.float32)
