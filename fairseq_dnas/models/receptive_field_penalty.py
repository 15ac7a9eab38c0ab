"""``--receptive-field-penalty C``: the regularizer of J. Kinley (2020,
Appendix) for every discrete model, penalizing the soft size of the
receptive fields of the positions the loss reads (the formula and why it
is not the appendix's as printed: docs/math.md, "Receptive fields").

During training the attention modules keep the relaxed sample S of each
forward (``keep_sample``; the single-stream module then leaves its fused
kernel, which keeps no S), and the model computes, per sentence b,

    P_b = sum over self-attention stacks of (1 / |Q_b|) sum_{i in Q_b} sum_j s^L_{b,ij}

(``fairseq_dnas.analysis.receptive_field.receptive_field_penalty``; with
``--receptive-field-layers all`` the size is averaged over the layers
l = 1..L): Q_b is ``<s>`` for a RoBERTa model called with a classification
head, else every real position; the stacks are the encoder (each view's,
for a multiview model) and, in translation, the decoder's causal
self-attention.

How it reaches the loss: fairseq's trainer optimizes what
``criterion(model, sample)`` returns, and no fairseq hook lets a model add a
term to any criterion's loss (only the wav2vec and HuBERT criterions read
``get_extra_losses``). So the model exposes P in its extra output
(``extra['receptive_field_penalty']``, (B,)) and keeps the batch's sum; a
torch forward hook on the criterion (``add_penalty``) adds

    loss <- loss + C * (sum_b P_b) * sample_size / nsentences

to whatever the criterion returned, so that after fairseq divides by
``sample_size`` the objective gains C times the mean P per sentence, for
every criterion and ``sample_size`` convention. The model installs the hook
on the criterion its task builds (``attach_to_task``: fairseq builds the
model first, and ``build_model`` receives the task), so ``--criterion``
stays the user's. The mean P per sentence is logged as ``rf_penalty``
(before C). With C = 0 (the default) nothing of this runs.
"""

import math
from typing import List, Optional, Sequence, Tuple

import torch
from fairseq.logging import metrics
from torch import Tensor

from fairseq_dnas.analysis.receptive_field import PENALTY_LAYERS, receptive_field_penalty
from fairseq_dnas.errors import BadFlag

PENALTY_FLAG = "--receptive-field-penalty"
LAYERS_FLAG = "--receptive-field-layers"
PENALTY_METRIC = "rf_penalty"
PENALTY_HELP = ("add FLOAT times the soft size of the receptive fields of the positions the loss reads to the "
                "training loss (the thesis's appendix uses 0.1; default 0 = off); logged as rf_penalty")
LAYERS_HELP = (f"{PENALTY_FLAG} on the fields after the final layer (the thesis's; default) or on their mean "
               "over all layers (gradient also where the final fields are full)")


def check_penalty(value, layers: str = "final") -> None:
    """BadFlag unless the coefficient is a finite number >= 0 and the layers
    one of ``PENALTY_LAYERS``."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    if not ok:
        raise BadFlag(f"{PENALTY_FLAG} must be a finite number >= 0 (0 = off; the thesis uses 0.1); got {value!r}")
    if layers not in PENALTY_LAYERS:
        raise BadFlag(f"{LAYERS_FLAG} {layers!r} is unknown; choose one of {', '.join(PENALTY_LAYERS)}")


def stack_modules(stack) -> List:
    """The self-attention modules of an encoder or decoder stack, bottom first."""
    return [layer.self_attn for layer in stack.layers]


class ReceptiveFieldPenaltyMixin:
    """Model mixin (before fairseq's model class): in training with C > 0,
    ``forward`` has the attention modules keep S, computes P per sentence
    and adds it to the batch's sum (``take_receptive_field_penalty``)."""

    def penalty_inputs(self, args, kwargs) -> Sequence[Tuple[List, Tensor, int, Optional[Tensor]]]:
        """(modules of a stack, its input tokens, padding index, readers Q
        (B, T) bool or None for every real position), per stack."""
        raise NotImplementedError

    def forward(self, *args, **kwargs):
        if not (self.training and getattr(self.args, "receptive_field_penalty", 0.0) > 0):
            return super().forward(*args, **kwargs)
        stacks = self.penalty_inputs(args, kwargs)
        modules = [m for mods, *_ in stacks for m in mods]
        for m in modules:
            m.keep_sample, m.kept_sample = True, None
        try:
            out = super().forward(*args, **kwargs)
            penalty = None
            for mods, tokens, pad, readers in stacks:
                if mods[0].kept_sample is None:
                    continue  # a stack this call did not run (the other view)
                samples = [m.kept_sample.transpose(0, 1) for m in mods]  # (H, B, T, T) each
                p = receptive_field_penalty(samples, tokens.eq(pad), readers,
                                            getattr(self.args, "receptive_field_layers", "final"))
                penalty = p if penalty is None else penalty + p
        finally:
            for m in modules:
                m.keep_sample, m.kept_sample = False, None
        if penalty is not None:
            out[1]["receptive_field_penalty"] = penalty
            total, count = getattr(self, "_rf_penalty", None) or (0.0, 0)  # the batch's forwards so far
            self._rf_penalty = (penalty.sum() + total, count + penalty.numel())
        return out

    def take_receptive_field_penalty(self) -> Optional[Tuple[Tensor, int]]:
        """(sum of P over the sentences of the forwards since the last call,
        their count), or None; resets."""
        taken = getattr(self, "_rf_penalty", None)
        self._rf_penalty = None
        return taken


class RobertaPenaltyMixin(ReceptiveFieldPenaltyMixin):
    """RoBERTa: the encoder stack(s); Q = <s> with a classification head."""

    def penalty_inputs(self, args, kwargs):
        tokens = args[0] if args else kwargs["src_tokens"]
        head = args[3] if len(args) > 3 else kwargs.get("classification_head_name")
        readers = None
        if head is not None:  # fairseq's classification head reads position 0
            readers = torch.zeros_like(tokens, dtype=torch.bool)
            readers[:, 0] = True
        encoders = [self.encoder.sentence_encoder, getattr(self.encoder, "second_view_encoder", None)]
        return [(stack_modules(e), tokens, e.padding_idx, readers) for e in encoders if e is not None]


class TranslationPenaltyMixin(ReceptiveFieldPenaltyMixin):
    """Encoder-decoder: the encoder on the source, the decoder's causal
    self-attention on the target prefix; every real position read."""

    def penalty_inputs(self, args, kwargs):
        src = args[0] if args else kwargs["src_tokens"]
        prev = args[2] if len(args) > 2 else kwargs["prev_output_tokens"]
        return [(stack_modules(self.encoder), src, self.encoder.padding_idx, None),
                (stack_modules(self.decoder), prev, self.decoder.padding_idx, None)]


def _taken(inputs):
    """What the model of a criterion call ``criterion(model, sample)`` kept."""
    model = inputs[0] if inputs else None
    model = getattr(model, "module", model)  # DistributedDataParallel
    return model.take_receptive_field_penalty() if hasattr(model, "take_receptive_field_penalty") else None


def discard_earlier(criterion, inputs):
    """The criterion forward pre-hook: forget what forwards outside this
    criterion call kept, so that only this call's forwards count."""
    _taken(inputs)


def add_penalty(coef: float):
    """The criterion forward hook: loss + C * sum_b P_b * sample_size / nsentences."""

    def hook(criterion, inputs, output):
        taken = _taken(inputs)
        if taken is None:
            return output  # validation (eval mode): no penalty
        loss, sample_size, logging_output = output
        total, count = taken
        metrics.log_scalar(PENALTY_METRIC, float(total.detach()) / count, weight=count, priority=895, round=3)
        logging_output["receptive_field_penalty"] = float(total.detach())
        return loss + coef * total * (sample_size / count), sample_size, logging_output

    return hook


def attach_to_task(task, args) -> None:
    """With C > 0, every criterion ``task`` builds from now on gets the hook."""
    coef = getattr(args, "receptive_field_penalty", 0.0)
    if not coef or getattr(task, "_rf_penalty_attached", False):
        return
    build = task.build_criterion

    def build_criterion(*a, **kw):
        criterion = build(*a, **kw)
        criterion.register_forward_pre_hook(discard_earlier)
        criterion.register_forward_hook(add_penalty(coef))
        return criterion

    task.build_criterion = build_criterion
    task._rf_penalty_attached = True
