"""ONNX Runtime as a decoder: an ONNX file with past key/values as inputs and present key/values as outputs
(``input_ids``, ``attention_mask``, ``position_ids``, ``past_key_values.N.key|value`` ->
``logits``, ``present.N.key|value``: the layout optimum and onnxruntime-genai use), the cache held here as
arrays between calls."""

from __future__ import annotations

from typing import Any, Sequence

from ..protocol import EXIT_RUNTIME, AgentFailure, Doc
from .decoder import Decoder
from .ort_runner import OnnxRunner

_NP_OF_ORT = {"tensor(float)": "float32", "tensor(float16)": "float16"}


class OnnxDecoder(Decoder, OnnxRunner):
    kv_source = "onnxruntime: the past key/value arrays the agent holds between calls"

    def load(self, model_path: str, request: Doc) -> None:
        import numpy as np

        OnnxRunner.load(self, model_path, request)
        ins = {i.name: i for i in self.session.get_inputs()}
        self.past_names = [n for n in self.input_names if n.startswith("past_key_values.")]
        missing = [n for n in ("input_ids", "position_ids") if n not in ins]
        if missing or not self.past_names:
            raise AgentFailure(
                "model_load_failed",
                f"{model_path} is not a decoder with a KV cache: it has no "
                f"{', '.join(missing) or 'past_key_values.* inputs'} (inputs: {self.input_names})",
                EXIT_RUNTIME,
            )
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.empty = []
        for n in self.past_names:
            shape = ins[n].shape  # [batch, kv heads, past, head dim]
            if len(shape) != 4 or not all(isinstance(d, int) for d in (shape[1], shape[3])):
                raise AgentFailure(
                    "model_load_failed",
                    f"{model_path}: past input {n} has shape {shape}; expected "
                    "[batch, kv_heads, past, head_dim] with fixed heads and head size",
                    EXIT_RUNTIME,
                )
            self.empty.append(np.zeros((1, shape[1], 0, shape[3]), _NP_OF_ORT.get(ins[n].type, "float32")))
        self.has_mask = "attention_mask" in ins
        self.past: list[Any] = list(self.empty)
        self.length = 0

    def forward(self, ids: Sequence[int], start: int) -> Any:
        import numpy as np

        n = len(ids)
        self.check_position(n, start)
        past = self.empty if start == 0 else self.past
        feed = {
            "input_ids": np.asarray(ids, np.int64)[None],
            "position_ids": np.arange(start, start + n, dtype=np.int64)[None],
            **dict(zip(self.past_names, past)),
        }
        if self.has_mask:
            feed["attention_mask"] = np.ones((1, start + n), np.int64)
        out = self.session.run(None, feed)
        by_name = dict(zip(self.output_names, out))
        self.past = [by_name[n.replace("past_key_values.", "present.")] for n in self.past_names]
        self.length = start + n
        return np.asarray(by_name.get("logits", out[0])[0], dtype=np.float32)

    def kv_cache_bytes(self) -> int | None:
        return int(sum(a.nbytes for a in self.past))
