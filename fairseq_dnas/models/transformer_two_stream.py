"""``transformer_discrete`` / ``transformer_two_stream``: the two-stream
encoder-decoder Transformer (J. Kinley, 2020, Sections 4.2 and 5.3): a
controller stream decides where each position attends, a model stream
carries the representations, and the output projection reads the model
stream. ``transformer_discrete`` samples the model stream's attention S from
the controller's logits (Gumbel-softmax in training, argmax at inference);
``transformer_two_stream`` uses S = A = softmax(L) (the soft variant).

    fairseq-train DATA --user-dir fairseq_dnas --arch transformer_discrete_iwslt_de_en ...

Flags: ``--gumbel-temperature``, ``--gumbel-hard``, ``--gumbel-anneal``,
``--discrete-scheme`` (dnas: encoder self-attention only), ``--discrete-sampler``
(``fairseq_dnas.models.discrete_args``), and ``--share-stream-embeddings``.
By default each stream has its own first layer of word embeddings (thesis
Section 4.2): the controller has its own token embeddings, positions and
embedding LayerNorm in the encoder and in the decoder, so it learns only
through S; ``--share-stream-embeddings`` makes the controller start from the
model stream's embedding (g^0 = h^0; the shared embeddings then also learn
through the controller).
"""

from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerConfig, TransformerModel
from fairseq.models.transformer.transformer_legacy import (
    base_architecture,
    tiny_architecture,
    transformer_iwslt_de_en,
)
from fairseq.utils import safe_getattr

from fairseq_dnas.errors import BadFlag
from fairseq_dnas.models.discrete_args import (
    add_discrete_args,
    apply_temperature,
    build_discrete_model,
    discrete_defaults,
    validate_discrete_args,
)
from fairseq_dnas.modules.two_stream import TwoStreamDecoder, TwoStreamEncoder
from fairseq_dnas.modules.two_stream_attention import TwoStreamAttention


def add_two_stream_args(parser) -> None:
    """The discrete flags and the two-stream ones (transformer and RoBERTa)."""
    add_discrete_args(parser)
    parser.add_argument(
        "--share-stream-embeddings", action="store_true",
        help="the controller stream reads the model stream's embedding (token embeddings, positions, embedding "
             "LayerNorm) instead of its own (default: each stream has its own, thesis Section 4.2)",
    )


def two_stream_defaults(args, sampler: str) -> None:
    discrete_defaults(args, sampler=sampler)
    args.share_stream_embeddings = safe_getattr(args, "share_stream_embeddings", False)


def validate_two_stream_args(args) -> None:
    """One-line BadFlag for settings the two-stream models cannot run."""
    validate_discrete_args(args)
    if safe_getattr(args, "quant_noise_pq", 0) > 0 and not args.share_stream_embeddings:
        raise BadFlag("--quant-noise-pq applies one embedding noise layer to both streams; "
                      "add --share-stream-embeddings or drop --quant-noise-pq")
    if safe_getattr(args, "checkpoint_activations", False):
        raise BadFlag("--checkpoint-activations is not supported by the two-stream models; drop it")
    for side in ("encoder", "decoder"):
        if safe_getattr(args, f"{side}_layerdrop", 0) > 0:
            raise BadFlag(f"--{side}-layerdrop is not supported by the two-stream models; drop it")
    # Nothing reads the top layer's controller output (the heads and the output
    # projection read h), so those weights get no gradient; torch's DDP then
    # needs to be told.
    if (safe_getattr(args, "distributed_world_size", 1) > 1
            and safe_getattr(args, "ddp_backend", "pytorch_ddp") in ("c10d", "pytorch_ddp")
            and not safe_getattr(args, "find_unused_parameters", False)):
        raise BadFlag(
            "the two-stream models leave the top layer's controller output unread (its weights get no "
            "gradient); with several GPUs add --find-unused-parameters (or --ddp-backend legacy_ddp)"
        )


def stream_attention_modules(model):
    """Every TwoStreamAttention of ``model``, in module order."""
    return [m for m in model.modules() if isinstance(m, TwoStreamAttention)]


class TwoStreamModelMixin:
    """set_num_updates: the Gumbel temperature of the next update (and its log)."""

    def set_num_updates(self, num_updates):
        super().set_num_updates(num_updates)
        apply_temperature(self, self.args, num_updates, log=self.training)


@register_model("transformer_two_stream")
class TransformerTwoStreamModel(TwoStreamModelMixin, TransformerModel):
    """fairseq's Transformer with a two-stream encoder and decoder."""

    @staticmethod
    def add_args(parser):
        TransformerModel.add_args(parser)
        add_two_stream_args(parser)

    @classmethod
    def build_model(cls, args, task):
        return build_discrete_model(super().build_model, args, task,
                                    lambda a: two_stream_defaults(a, "gumbel"), validate_two_stream_args)

    @classmethod
    def _controller_embedding(cls, args, dictionary, dim):
        """The controller's token embeddings (its own table), or None with --share-stream-embeddings."""
        if args.share_stream_embeddings:
            return None
        return cls.build_embedding(args, dictionary, dim)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return TwoStreamEncoder(
            TransformerConfig.from_namespace(args), src_dict, embed_tokens,
            controller_embed_tokens=cls._controller_embedding(args, src_dict, args.encoder_embed_dim),
        )

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return TwoStreamDecoder(
            TransformerConfig.from_namespace(args), tgt_dict, embed_tokens,
            no_encoder_attn=args.no_cross_attention,
            controller_embed_tokens=cls._controller_embedding(args, tgt_dict, args.decoder_embed_dim),
        )


# --- architectures -----------------------------------------------------------


def register_sized(model, name, sampler, presets) -> None:
    """Register ``{name}{suffix}`` for each (suffix, sizes) of ``presets``
    under ``model``: the two-stream defaults with S from ``sampler``, then the sizes."""
    for suffix, sizes in presets:

        def arch(args, sizes=sizes):
            two_stream_defaults(args, sampler)
            sizes(args)

        arch.__name__ = f"{name}{suffix}"
        arch.__doc__ = f"Two-stream model, S from {sampler!r}, sizes of {sizes.__name__}."
        register_model_architecture(model, arch.__name__)(arch)


# ``{name}``, ``{name}_iwslt_de_en`` (fairseq's transformer_iwslt_de_en: the
# thesis's IWSLT model, 512 wide, FFN 1,024, 6 + 6 layers, 4 heads) and
# ``{name}_tiny`` (fairseq's transformer_tiny: 2 + 2 layers, 64 wide, FFN 64,
# 2 heads; a CPU size, the same as transformer_discrete_single_tiny's).
PRESETS = (("", base_architecture), ("_iwslt_de_en", transformer_iwslt_de_en), ("_tiny", tiny_architecture))
register_sized("transformer_two_stream", "transformer_discrete", "gumbel", PRESETS)
register_sized("transformer_two_stream", "transformer_two_stream", "soft", PRESETS)
