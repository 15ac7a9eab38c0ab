"""The receptive-field penalty of J. Kinley (2020, Appendix) as fairseq
criterions: ``--criterion <base>_rf_penalty`` is fairseq's criterion
``<base>`` (its flags included) whose training loss gains C times the soft
size of the receptive fields of the positions the loss reads (the formula,
and why it is not the appendix's as printed: docs/math.md, "Receptive
fields"):

    fairseq-train DATA --user-dir fairseq_dnas --arch roberta_discrete_thesis \\
        --task sentence_prediction --criterion sentence_prediction_rf_penalty \\
        --receptive-field-penalty 0.1 ...

Registered for ``cross_entropy``, ``label_smoothed_cross_entropy``,
``masked_lm``, ``sentence_prediction`` and (in its own module)
``sentence_prediction_multiview``; ``register_penalized(name)`` wraps any
other registered criterion the same way.

In training, the criterion has every self-attention module of the model's
stacks keep its relaxed sample S (``keep_sample``; the single-stream module
then leaves its fused kernel, which keeps no S), runs the base criterion,
and computes per sentence b

    P_b = sum over self-attention stacks of (1 / |Q_b|) sum_{i in Q_b} sum_j s^L_{b,ij}

(``fairseq_dnas.attention.receptive_field.receptive_field_penalty``; with
``--receptive-field-layers all`` averaged over the layers l = 1..L). Q_b is
``<s>`` when the base criterion reads a classification head (it has a
``classification_head_name``), else every real position. The stacks are
the encoder's (each view's for a multiview model, on that view's tokens)
and, for an encoder-decoder model, the decoder's causal self-attention on
the target prefix; for a decoder-only language model
(``transformer_lm_discrete_single``, ``--task language_modeling``) the
decoder's causal self-attention on ``src_tokens``, every real position a
reader (each predicts the next token). The returned loss is

    loss + C * (sum_b P_b) * sample_size / nsentences

so that after fairseq divides by ``sample_size`` the objective gains C times
the mean P_b, whatever the base criterion's ``sample_size`` is. The mean P_b
is logged as ``rf_penalty`` (before C); validation (eval mode) and C = 0 run
the base criterion alone, and so do the updates before
``--receptive-field-penalty-start N`` (default 0: from the first update;
the count is the one fairseq hands the model, ``model.num_updates``, so a
resumed run switches on at the same update).
"""

import math
from contextlib import contextmanager
from dataclasses import field, make_dataclass
from typing import List, Optional, Sequence, Tuple

import torch
from fairseq.criterions import CRITERION_REGISTRY, FairseqCriterion, register_criterion
from fairseq.dataclass import ChoiceEnum
from fairseq.logging import metrics
from torch import Tensor

from fairseq_dnas.attention.receptive_field import PENALTY_LAYERS, receptive_field_penalty
from fairseq_dnas.errors import BadFlag

SUFFIX = "_rf_penalty"
PENALTY_FLAG = "--receptive-field-penalty"
LAYERS_FLAG = "--receptive-field-layers"
START_FLAG = "--receptive-field-penalty-start"
PENALTY_METRIC = "rf_penalty"
PENALTY_HELP = ("add FLOAT times the soft size of the receptive fields of the positions the loss reads to the "
                "training loss (the thesis's appendix uses 0.1, the default; 0 = off); logged as rf_penalty")
LAYERS_HELP = (f"{PENALTY_FLAG} on the fields after the final layer (the thesis's; default) or on their mean "
               "over all layers (gradient also where the final fields are full)")
START_HELP = (f"{PENALTY_FLAG} from update N on (default 0: from the first update); the first N updates train "
              "on the base criterion alone, rf_penalty unlogged")
# fairseq's criterions the discrete models train with.
BASES = ("cross_entropy", "label_smoothed_cross_entropy", "masked_lm", "sentence_prediction")

Stack = Tuple[List, Tensor, int, Optional[Tensor]]  # (attention modules, tokens, padding index, readers)


def check_penalty(value, layers: str = "final", start: int = 0) -> None:
    """BadFlag unless the coefficient is a finite number >= 0, the layers
    one of ``PENALTY_LAYERS`` and the start an update count >= 0."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    if not ok:
        raise BadFlag(f"{PENALTY_FLAG} must be a finite number >= 0 (0 = off; the thesis uses 0.1); got {value!r}")
    if layers not in PENALTY_LAYERS:
        raise BadFlag(f"{LAYERS_FLAG} {layers!r} is unknown; choose one of {', '.join(PENALTY_LAYERS)}")
    if not (isinstance(start, int) and not isinstance(start, bool) and start >= 0):
        raise BadFlag(f"{START_FLAG} must be an update count >= 0 (0 = from the first update); got {start!r}")


def updates_done(model) -> int:
    """The update count fairseq last handed the model (``set_num_updates``;
    the discrete models record it, ``discrete_args.apply_temperature``)."""
    model = getattr(model, "module", model)  # DistributedDataParallel
    count = getattr(model, "num_updates", None)
    if count is None:
        raise BadFlag(f"{START_FLAG} needs a model that records fairseq's update count (the plugin's discrete "
                      f"models do); drop {START_FLAG} or use one of them")
    return count


def _self_attention(stack) -> List:
    modules = [layer.self_attn for layer in stack.layers]
    if not all(hasattr(m, "keep_sample") for m in modules):
        raise BadFlag(f"the receptive-field penalty (--criterion *{SUFFIX}) needs a discrete model "
                      "(transformer_discrete*, transformer_lm_discrete*, roberta_discrete*, *_two_stream*); "
                      "use the base criterion")
    return modules


def penalty_stacks(model, sample, classification: bool) -> List[Stack]:
    """The self-attention stacks the penalty sums over, each with the tokens
    it reads: the encoder (RoBERTa: each view's, on that view's tokens) and
    an encoder-decoder model's decoder on the target prefix; a decoder-only
    language model's decoder on ``src_tokens``. Readers: ``<s>``
    (position 0, what fairseq's classification head reads) with
    ``classification``, else None (every real position)."""
    model = getattr(model, "module", model)  # DistributedDataParallel
    net_input = sample["net_input"]
    tokens = net_input["src_tokens"]
    if getattr(model, "decoder", None) is not None and getattr(model, "encoder", None) is None:
        # A decoder-only language model (language_modeling): its causal
        # self-attention reads src_tokens, and every real position predicts.
        return [(_self_attention(model.decoder), tokens, model.decoder.padding_idx, None)]
    if getattr(model, "decoder", None) is not None:
        return [(_self_attention(model.encoder), tokens, model.encoder.padding_idx, None),
                (_self_attention(model.decoder), net_input["prev_output_tokens"], model.decoder.padding_idx, None)]
    views = [(model.encoder.sentence_encoder, tokens)]
    second = getattr(model.encoder, "second_view_encoder", None)
    if second is not None and "net_input1" in sample:
        views.append((second, sample["net_input1"]["src_tokens"]))
    stacks = []
    for encoder, toks in views:
        readers = None
        if classification:
            readers = torch.zeros_like(toks, dtype=torch.bool)
            readers[:, 0] = True
        stacks.append((_self_attention(encoder), toks, encoder.padding_idx, readers))
    return stacks


@contextmanager
def kept_samples(stacks: Sequence[Stack]):
    """The stacks' attention modules keep the S of their forwards (with its graph) inside the block."""
    modules = [m for mods, *_ in stacks for m in mods]
    for m in modules:
        m.keep_sample, m.kept_sample = True, None
    try:
        yield
    finally:
        for m in modules:
            m.keep_sample, m.kept_sample = False, None


def sentence_penalty(stacks: Sequence[Stack], layers: str = "final") -> Optional[Tensor]:
    """P_b (B,), summed over the stacks that ran, from the samples they kept
    (inside ``kept_samples``); None when none ran."""
    penalty = None
    for mods, tokens, pad, readers in stacks:
        if mods[0].kept_sample is None:
            continue
        samples = [m.kept_sample.transpose(0, 1) for m in mods]  # (H, B, T, T) each
        p = receptive_field_penalty(samples, tokens.eq(pad), readers, layers)
        penalty = p if penalty is None else penalty + p
    return penalty


class ReceptiveFieldPenaltyCriterion(FairseqCriterion):
    """``base_class`` (a fairseq criterion) plus C times the receptive-field
    penalty in training. One subclass per base (``register_penalized``)."""

    base_class = None

    def __init__(self, task, base, coef: float, layers: str, start: int = 0):
        super().__init__(task)
        self.base, self.coef, self.layers, self.start = base, coef, layers, start

    @classmethod
    def build_criterion(cls, cfg, task):
        start = cfg.receptive_field_penalty_start
        check_penalty(cfg.receptive_field_penalty, cfg.receptive_field_layers, start)
        base = cls.base_class.build_criterion(cfg, task)  # takes its own fields from cfg
        return cls(task, base, float(cfg.receptive_field_penalty), cfg.receptive_field_layers, start)

    def forward(self, model, sample, reduce=True):
        if not (model.training and self.coef > 0) or (self.start and updates_done(model) < self.start):
            return self.base(model, sample, reduce=reduce)
        stacks = penalty_stacks(model, sample, hasattr(self.base, "classification_head_name"))
        with kept_samples(stacks):
            loss, sample_size, logging_output = self.base(model, sample, reduce=reduce)
            penalty = sentence_penalty(stacks, self.layers)
        count = penalty.numel()
        total = penalty.sum()
        logging_output["receptive_field_penalty"] = float(total.detach())
        logging_output["rf_nsentences"] = count
        return loss + self.coef * total * (sample_size / count), sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        cls.base_class.reduce_metrics(logging_outputs)
        count = sum(log.get("rf_nsentences", 0) for log in logging_outputs)
        if count:
            total = sum(log.get("receptive_field_penalty", 0.0) for log in logging_outputs)
            metrics.log_scalar(PENALTY_METRIC, total / count, weight=count, priority=895, round=3)

    @classmethod
    def logging_outputs_can_be_summed(cls) -> bool:
        return cls.base_class.logging_outputs_can_be_summed()


def register_penalized(base_name: str):
    """Register ``<base_name>_rf_penalty``: the criterion ``base_name`` with
    its dataclass's flags plus ``--receptive-field-penalty`` and
    ``--receptive-field-layers``. Returns the criterion class."""
    from fairseq.criterions import CRITERION_DATACLASS_REGISTRY

    base_class = CRITERION_REGISTRY[base_name]
    base_config = CRITERION_DATACLASS_REGISTRY[base_name]
    config = make_dataclass(
        f"{base_config.__name__}RFPenalty",
        [("receptive_field_penalty", float, field(default=0.1, metadata={"help": PENALTY_HELP})),
         ("receptive_field_layers", ChoiceEnum(PENALTY_LAYERS), field(default="final",
                                                                       metadata={"help": LAYERS_HELP})),
         ("receptive_field_penalty_start", int, field(default=0, metadata={"help": START_HELP}))],
        bases=(base_config,),
    )
    name = "".join(part.title() for part in base_name.split("_")) + "RFPenaltyCriterion"
    cls = type(name, (ReceptiveFieldPenaltyCriterion,), {"base_class": base_class, "__doc__": (
        f"fairseq's ``{base_name}`` criterion plus C times the receptive-field penalty in training.")})
    return register_criterion(base_name + SUFFIX, dataclass=config)(cls)


for _base in BASES:
    if _base + SUFFIX not in CRITERION_REGISTRY:
        register_penalized(_base)
