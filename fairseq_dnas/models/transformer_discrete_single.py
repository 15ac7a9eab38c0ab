"""``transformer_discrete_single``: the single-stream discrete Transformer of
J. Kinley (2020), Section 4.1, for translation.

fairseq's ``transformer`` with every attention (encoder self, decoder causal
self, encoder-decoder) a sampled choice of one position per head and query:
the Gumbel-softmax relaxation during training, the argmax at inference, so
every hidden state depends only on the positions it attended to
(``fairseq_dnas.modules.discrete_layers``). Same parameters as
``transformer``: a plain checkpoint of the same shape initializes it.

    fairseq-train DATA --user-dir fairseq_dnas --arch transformer_discrete_single_iwslt_de_en \\
        --gumbel-temperature 1 ...

Sizes: ``transformer_discrete_single`` (fairseq's base), ``_iwslt_de_en``
(512 wide, FFN 1,024, 6+6 layers, 4 heads: the thesis's IWSLT model, Section
5.3) and ``_tiny`` (fairseq's ``transformer_tiny``: a CPU size).
"""

from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerConfig, TransformerModel
from fairseq.models.transformer.transformer_legacy import (
    base_architecture,
    tiny_architecture,
    transformer_iwslt_de_en,
)

from fairseq_dnas.models.discrete_args import (
    add_discrete_args,
    apply_temperature,
    build_discrete_model,
    discrete_defaults,
    validate_discrete_args,
)
from fairseq_dnas.modules.discrete_layers import DiscreteTransformerDecoder, DiscreteTransformerEncoder


@register_model("transformer_discrete_single")
class TransformerDiscreteSingleModel(TransformerModel):
    """fairseq's Transformer with discrete attention everywhere.

    With ``--discrete-sampler soft`` (S = softmax(L)) it computes what
    fairseq's ``transformer`` computes (tests/test_discrete_models.py).
    """

    @staticmethod
    def add_args(parser):
        TransformerModel.add_args(parser)
        add_discrete_args(parser)

    @classmethod
    def build_model(cls, args, task):
        return build_discrete_model(super().build_model, args, task, discrete_single_architecture,
                                    validate_discrete_args)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return DiscreteTransformerEncoder(TransformerConfig.from_namespace(args), src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return DiscreteTransformerDecoder(
            TransformerConfig.from_namespace(args), tgt_dict, embed_tokens,
            no_encoder_attn=args.no_cross_attention,
        )

    def set_num_updates(self, num_updates):
        """fairseq's trainer calls this after loading a checkpoint and after
        every update: set tau for the next forward (annealing) and log it."""
        super().set_num_updates(num_updates)
        apply_temperature(self, self.args, num_updates, log=self.training)


# --- architectures -----------------------------------------------------------


@register_model_architecture("transformer_discrete_single", "transformer_discrete_single")
def discrete_single_architecture(args):
    discrete_defaults(args)
    base_architecture(args)


@register_model_architecture("transformer_discrete_single", "transformer_discrete_single_iwslt_de_en")
def discrete_single_iwslt_de_en(args):
    discrete_defaults(args)
    transformer_iwslt_de_en(args)


@register_model_architecture("transformer_discrete_single", "transformer_discrete_single_tiny")
def discrete_single_tiny(args):
    """The sizes of fairseq's ``transformer_tiny`` (2 + 2 layers, 64 wide, FFN
    64, 2 heads): a CPU size for tests and smoke runs, beside its baseline."""
    discrete_defaults(args)
    tiny_architecture(args)
