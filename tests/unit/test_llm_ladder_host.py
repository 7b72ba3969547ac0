"""Issue #45 item 3: the int4 ladder's rung is picked on the host, on the PyTorch model rounded as the file stores it,
activations included for ExecuTorch's 8da4w (int8 per token), so the slow lowering runs once."""

from __future__ import annotations

import numpy as np
import torch
from lm_zoo import build_tiny_lm, eval_text

from edgekit.llm.int4_ladder import act_int8, fake_quant_kld
from edgekit.llm.layer_plan import plan_int4
from edgekit.llm.source import load_lm
from edgekit.llm.text import load_eval_text


def test_int8_activations_round_per_token_within_one_step():
    x = torch.tensor([[0.0, 1.0, -0.5, 2.0], [3.0, 3.0, 3.0, 3.0]])
    q = act_int8(x)
    step = (x.amax(dim=-1, keepdim=True).clamp(min=0) - x.amin(dim=-1, keepdim=True).clamp(max=0)) / 255
    assert torch.all((q - x).abs() <= step / 2 + 1e-6), (q, x)
    assert q[0, 0] == 0.0  # zero is exact (its zero point)


def test_the_host_check_with_int8_activations_costs_a_little_more_and_restores_the_model(tmp_path):
    src = load_lm(build_tiny_lm("llama"))
    windows = load_eval_text(eval_text(tmp_path), src.tokenizer, window=48, max_windows=2).windows
    before = {n: p.detach().clone() for n, p in src.model.named_parameters()}
    with torch.no_grad():
        float_logp = [torch.log_softmax(src.model(torch.as_tensor(row[None].astype(np.int64))).logits[0].double(), -1)
                      for row in windows]
    plan = plan_int4(src.model, group=32)
    weights_only = fake_quant_kld(src.model, windows, plan, float_logp)
    with_acts = fake_quant_kld(src.model, windows, plan, float_logp, activations=True)
    assert 0 < weights_only < with_acts < 10 * weights_only + 1e-3, (weights_only, with_acts)
    after = dict(src.model.named_parameters())
    assert all(torch.equal(before[n], after[n]) for n in before)  # the float model is put back
    assert not any(m._forward_pre_hooks for m in src.model.modules())  # and its hooks removed
