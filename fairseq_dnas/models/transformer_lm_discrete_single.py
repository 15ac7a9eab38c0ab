"""``transformer_lm_discrete_single``: a decoder-only language model with the
single-stream discrete attention of J. Kinley (2020), Section 4.1, for
fairseq's ``language_modeling`` task: the model of the thesis's appendix
("Dependency Learning On A Synthetic Language modeling Task").

fairseq's ``transformer_lm`` whose every layer's causal self-attention is a
sampled choice of one position per head and query (the Gumbel-softmax
relaxation in training, the argmax at inference), built from the decoder of
``transformer_discrete_single`` (``DiscreteTransformerDecoder``) without
encoder attention. fairseq's decoder hands each layer its future mask as
``attn_mask`` (-inf above the diagonal); the discrete attention adds it to
the logits before the Gumbel noise, the relaxed softmax and the argmax, so
no position chooses, or passes gradient to, a later one
(tests/test_dependencies.py). Same parameters as ``transformer_lm``.

    fairseq-train DATA --user-dir fairseq_dnas --task language_modeling \\
        --arch transformer_lm_discrete_single_thesis \\
        --criterion cross_entropy_rf_penalty --receptive-field-penalty 0.1 ...

Sizes: ``transformer_lm_discrete_single`` (fairseq's ``transformer_lm``),
``_thesis`` (the appendix's: 4 layers, 64 wide, FFN 256, 2 heads) and
``_tiny`` (2 layers, 32 wide, FFN 64, 2 heads: tests). ``--discrete-sampler
soft`` gives fairseq's ``transformer_lm`` (S = softmax(L)) with the same
modules, so the soft baseline trains with the same command and criterion.
"""

from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerConfig
from fairseq.models.transformer_lm import TransformerLanguageModel, TransformerLanguageModelConfig, base_lm_architecture
from fairseq.utils import safe_getattr

from fairseq_dnas.errors import BadFlag
from fairseq_dnas.models.discrete_args import (
    add_discrete_args,
    apply_temperature,
    build_discrete_model,
    discrete_defaults,
    validate_discrete_args,
)
from fairseq_dnas.modules.discrete_layers import DiscreteTransformerDecoder


def validate_lm_args(args) -> None:
    """The discrete flags' checks, plus what this decoder cannot build."""
    validate_discrete_args(args)
    if args.discrete_scheme != "unas":
        raise BadFlag("--discrete-scheme dnas needs every query at once; a language model's causal "
                      "self-attention samples from softmax(L): drop --discrete-scheme")
    if safe_getattr(args, "character_embeddings", False) or safe_getattr(args, "adaptive_input", False):
        raise BadFlag("transformer_lm_discrete_single builds plain token embeddings: "
                      "drop --character-embeddings / --adaptive-input")


@register_model("transformer_lm_discrete_single")
class TransformerLMDiscreteSingleModel(TransformerLanguageModel):
    """fairseq's ``transformer_lm`` with discrete causal self-attention."""

    @staticmethod
    def add_args(parser):
        # Registered without a dataclass (so that the discrete flags, argparse
        # ones, can join): transformer_lm's flags come from its dataclass,
        # without defaults (as fairseq's add_args does), so that the
        # architecture functions set them.
        gen_parser_from_dataclass(parser, TransformerLanguageModelConfig(), delete_default=True)
        add_discrete_args(parser, sinkhorn=True)

    @classmethod
    def build_model(cls, args, task):
        return build_discrete_model(cls._build, args, task, lm_discrete_single_architecture, validate_lm_args)

    @classmethod
    def _build(cls, args, task):
        """``TransformerLanguageModel.build_model`` with the discrete decoder."""
        if args.decoder_layers_to_keep:
            args.decoder_layers = len(args.decoder_layers_to_keep.split(","))
        if safe_getattr(args, "max_target_positions", None) is None:
            args.max_target_positions = safe_getattr(args, "tokens_per_sample", 1024)
        embed_tokens = cls.build_embedding(args, task.source_dictionary, args.decoder_input_dim)
        # fairseq's legacy TransformerDecoder converts args the same way.
        cfg = TransformerConfig.from_namespace(args)
        decoder = DiscreteTransformerDecoder(cfg, task.target_dictionary, embed_tokens, no_encoder_attn=True)
        model = cls(decoder)
        model.args = args  # read by set_num_updates (the temperature schedule), as TransformerModel's
        return model

    def set_num_updates(self, num_updates):
        """tau for the next forward (annealing), as the translation models."""
        super().set_num_updates(num_updates)
        apply_temperature(self, self.args, num_updates, log=self.training)


# --- architectures -----------------------------------------------------------


@register_model_architecture("transformer_lm_discrete_single", "transformer_lm_discrete_single")
def lm_discrete_single_architecture(args):
    discrete_defaults(args)
    base_lm_architecture(args)


@register_model_architecture("transformer_lm_discrete_single", "transformer_lm_discrete_single_thesis")
def lm_discrete_single_thesis(args):
    """The appendix's sizes: d_model 64, d_ff 256, L 4, h 2."""
    args.decoder_embed_dim = safe_getattr(args, "decoder_embed_dim", 64)
    args.decoder_ffn_embed_dim = safe_getattr(args, "decoder_ffn_embed_dim", 256)
    args.decoder_layers = safe_getattr(args, "decoder_layers", 4)
    args.decoder_attention_heads = safe_getattr(args, "decoder_attention_heads", 2)
    lm_discrete_single_architecture(args)


@register_model_architecture("transformer_lm_discrete_single", "transformer_lm_discrete_single_tiny")
def lm_discrete_single_tiny(args):
    """A test size: 2 layers, 32 wide, FFN 64, 2 heads."""
    args.decoder_embed_dim = safe_getattr(args, "decoder_embed_dim", 32)
    args.decoder_ffn_embed_dim = safe_getattr(args, "decoder_ffn_embed_dim", 64)
    args.decoder_layers = safe_getattr(args, "decoder_layers", 2)
    args.decoder_attention_heads = safe_getattr(args, "decoder_attention_heads", 2)
    lm_discrete_single_architecture(args)
