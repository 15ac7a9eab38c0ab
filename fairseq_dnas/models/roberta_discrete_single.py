"""``roberta_discrete_single``: fairseq's RoBERTa encoder (``--task
sentence_prediction`` or ``masked_lm``) whose every self-attention is
discrete, the single-stream discrete Transformer of J. Kinley (2020),
Section 4.1, as a classifier: a classification token first, a head on its
final state. The thesis's head is one learned linear layer (Section 5.3,
"Text Classification"); fairseq's classification head, used here as in
every ``roberta`` model of the plugin, is dense, tanh, then the output
projection (with dropout before each linear layer).

    fairseq-train DATA --user-dir fairseq_dnas --task sentence_prediction \\
        --arch roberta_discrete_single_thesis --num-classes 2 ...

Sizes: ``roberta_discrete_single`` (RoBERTa base), ``_small`` (the plugin's
CPU size) and ``_thesis`` (6 layers, 64 wide, FFN 128, 4 heads: Section 5.3).
Built as ``roberta_dnas`` is (``build_roberta``): only the encoder stack is
swapped, everything else is fairseq's ``RobertaModel``.
"""

from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta import RobertaModel
from fairseq.models.roberta.model import base_architecture

from fairseq_dnas.models.discrete_args import (
    add_discrete_args,
    apply_temperature,
    discrete_defaults,
    validate_discrete_args,
)
from fairseq_dnas.models.roberta_dnas import (
    DNASRobertaEncoder,
    build_roberta,
    small_architecture,
    thesis_architecture,
)
from fairseq_dnas.modules.discrete_layers import DiscreteTransformerEncoder


class DiscreteRobertaEncoder(DNASRobertaEncoder):
    """fairseq's RoBERTa encoder around a ``DiscreteTransformerEncoder``."""

    stack_class = DiscreteTransformerEncoder


@register_model("roberta_discrete_single")
class RobertaDiscreteSingleModel(RobertaModel):
    """fairseq's RoBERTa with discrete self-attention in every layer."""

    @staticmethod
    def add_args(parser):
        RobertaModel.add_args(parser)
        add_discrete_args(parser)

    @classmethod
    def build_model(cls, args, task):
        model = build_roberta(cls, args, task, DiscreteRobertaEncoder,
                              roberta_discrete_single_architecture, validate_discrete_args)
        apply_temperature(model, args, 0, log=False)
        return model

    def attention_modules(self):
        """The encoder's discrete attention modules, bottom layer first."""
        return self.encoder.sentence_encoder.attention_modules()

    def set_num_updates(self, num_updates):
        """Set tau for the next forward (annealing) and log it."""
        super().set_num_updates(num_updates)
        apply_temperature(self, self.args, num_updates, log=self.training)


# --- architectures -----------------------------------------------------------


@register_model_architecture("roberta_discrete_single", "roberta_discrete_single")
def roberta_discrete_single_architecture(args):
    discrete_defaults(args)
    base_architecture(args)


@register_model_architecture("roberta_discrete_single", "roberta_discrete_single_small")
def roberta_discrete_single_small(args):
    discrete_defaults(args)
    small_architecture(args)


@register_model_architecture("roberta_discrete_single", "roberta_discrete_single_thesis")
def roberta_discrete_single_thesis(args):
    discrete_defaults(args)
    thesis_architecture(args)
