"""Attention's share of the residual stream (``attention_share``): per
encoder layer l and non-padding token t (``<s>`` and ``</s>`` included),
r_lt = ||o_lt||_2 / ||x_lt||_2, x_l the residual stream entering the layer
(the input of the attention sub-layer's residual add) and o_l what the
attention sub-layer adds to it (after its output projection, before the
add; dropout is off in eval mode); reported per layer as the mean and the
median over the tokens of the test set. Read by hooks
(``ResidualAttention``): a pre-hook on each layer for x_l and a hook on the
attention module (its returned output) or, in a two-stream layer, on each
stream's output projection (``out_proj``: the controller g, W_o^g A v;
``model_out_proj``: the model stream h, W_o^h S v'). A small r_l means the
layer barely uses attention, whatever its attention looks like.

The faithfulness command (``commands/faithfulness.py``) reports it beside
Kendall's tau; the metric itself is in ``faithfulness.py``.
"""

from typing import Dict, List, Sequence

import numpy as np
import torch
from torch import Tensor

from fairseq_dnas.analysis.capture import SINGLE_STREAM, TWO_STREAM, Hooks, encoder_stack


def attention_share(attn_out: Tensor, residual: Tensor, padding: Tensor) -> Tensor:
    """r_t = ||o_t||_2 / ||x_t||_2 at the non-padding tokens t of one layer,
    float64, flat in batch-major order (example 0's tokens first).

    attn_out o, residual x: (T, B, C), fairseq's layout (o: the attention
    sub-layer's output before the residual add x + o); padding: (B, T) bool,
    True at padding."""
    ratio = attn_out.double().norm(dim=-1) / residual.double().norm(dim=-1)  # (T, B)
    return ratio.t()[~padding]  # (B, T) -> the non-padding tokens


def share_summary(per_layer: Sequence[Sequence[Tensor]]) -> Dict[str, List[float]]:
    """{'mean': [...], 'median': [...]} per layer (bottom first) of the
    ratios r_lt of every batch: ``per_layer[l]`` holds one flat tensor per
    batch (``attention_share``); the median is numpy's (the middle two
    averaged when the count is even)."""
    ratios = [torch.cat(list(batches)).numpy() for batches in per_layer]
    return {"mean": [float(r.mean()) for r in ratios], "median": [float(np.median(r)) for r in ratios]}


class ResidualAttention(Hooks):
    """While active (``with``), the last forward of ``model`` leaves, per
    encoder layer and stream, the residual stream entering the layer x_l and
    what the layer's attention adds to it o_l, both (T, B, C) and detached:
    ``self.pairs[stream][l] = (o_l, x_l)``. Streams: ``SINGLE_STREAM``
    ('self') for a single-stream encoder; 'model' (h, argument 1 of the
    layer, and ``model_out_proj``'s output) and 'controller' (g, argument 0,
    and ``out_proj``'s output) for a two-stream one. The model runs
    unchanged; the hooks only read."""

    def __init__(self, model):
        super().__init__()
        self.layers = list(encoder_stack(model).layers)
        self.pairs: Dict[str, List[list]] = {}

    def __enter__(self):
        for n, layer in enumerate(self.layers):
            attn = layer.self_attn
            if getattr(attn, "capture_name", None) == TWO_STREAM:  # forward(g, h, mask)
                streams = (("model", getattr(layer, "model_stream_input", 1), attn.model_out_proj, False),
                           ("controller", 0, attn.out_proj, False))
            else:  # fairseq's layer: forward(x, ...); its attention returns (output, weights)
                streams = ((SINGLE_STREAM, 0, attn, True),)
            for name, arg, source, first in streams:
                slots = self.pairs.setdefault(name, [[None, None] for _ in self.layers])[n]
                self._handles.append(layer.register_forward_pre_hook(self._keep_input(slots, arg)))
                self._handles.append(source.register_forward_hook(self._keep_output(slots, first)))
        return self

    @staticmethod
    def _keep_input(slots, arg):
        def hook(module, args):
            slots[1] = args[arg].detach()

        return hook

    @staticmethod
    def _keep_output(slots, first):
        def hook(module, args, output):
            slots[0] = (output[0] if first else output).detach()

        return hook

    def shares(self, padding: Tensor) -> Dict[str, List[Tensor]]:
        """{stream: [r_l per layer, each flat over the non-padding tokens]}
        of the last forward, whose padding (B, T) is given."""
        out = {}
        for name, layers in self.pairs.items():
            if any(o is None or x is None for o, x in layers):
                raise RuntimeError(f"attention share: the {name!r} stream of some layer was not seen; "
                                   "run one forward of the model inside the 'with' block")
            out[name] = [attention_share(o, x, padding) for o, x in layers]
        return out
