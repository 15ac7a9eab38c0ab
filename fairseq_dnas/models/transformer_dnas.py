"""``transformer_dnas`` / ``transformer_hnas``: a Transformer whose encoder
self-attention is doubly-normalized (DNAS) or hybrid (HNAS), Ding et al. (2020).

The decoder stays fairseq's standard softmax attention (UNAS): DNAS normalizes
each key over *all* queries, and during incremental decoding the future
decoder queries do not exist yet.

    fairseq-train DATA --user-dir fairseq_dnas --arch transformer_hnas ...
"""

import argparse
import logging

from fairseq.logging import metrics
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerConfig, TransformerModel
from fairseq.models.transformer.transformer_legacy import (
    base_architecture,
    transformer_iwslt_de_en,
    transformer_vaswani_wmt_en_de_big,
)

from fairseq_dnas.attention.functional import SCHEMES, check_sinkhorn_iters
from fairseq_dnas.errors import BadFlag
from fairseq_dnas.modules import DNASTransformerEncoder
from fairseq_dnas.modules.dnas_multihead_attention import HYBRID_PER, DNASMultiheadAttention, check_hybrid_init

logger = logging.getLogger(__name__)


def validate_attention_args(args) -> None:
    """Reject bad scheme settings at build time with a BadFlag saying what to
    change (fairseq's commands print it as one line ``error: ...``)."""
    scheme = getattr(args, "encoder_attention_scheme", None)
    if scheme not in SCHEMES:
        raise BadFlag(
            f"--encoder-attention-scheme {scheme!r} is unknown; choose one of "
            f"{', '.join(SCHEMES)}"
        )
    decoder_scheme = getattr(args, "decoder_attention_scheme", "unas")
    if decoder_scheme != "unas":
        raise BadFlag(
            f"--decoder-attention-scheme {decoder_scheme} is not possible: DNAS "
            "normalizes every key over all queries, and during incremental "
            "(step-by-step) decoding the future decoder queries do not exist yet. "
            "Keep the decoder at 'unas' (the paper's setting, Table 3) and put "
            "DNAS/HNAS in the encoder with --encoder-attention-scheme."
        )
    try:
        check_sinkhorn_iters(args.sinkhorn_iters)
    except ValueError:
        raise BadFlag(
            f"--sinkhorn-iters must be an integer >= 1 (1 is the paper's DNAS, "
            f"more approach a doubly-stochastic matrix); got {args.sinkhorn_iters!r}"
        ) from None
    try:
        check_hybrid_init(args.hybrid_init)  # its message names --hybrid-init and what to use instead
    except ValueError as err:
        raise BadFlag(str(err)) from None
    if args.hybrid_weight_per not in HYBRID_PER:
        raise BadFlag(
            f"--hybrid-weight-per must be one of {', '.join(HYBRID_PER)}; got "
            f"{args.hybrid_weight_per!r}"
        )
    check_flags_apply(args)


GIVEN = "dnas_flags_given"  # the scheme flags set on the command line (checked by validate_attention_args)
ONLY_FOR = {  # flag -> the encoder schemes that read it
    "--hybrid-init": ("hnas",),
    "--hybrid-weight-per": ("hnas",),
    "--sinkhorn-iters": ("dnas", "hnas"),
}


class _Given(argparse.Action):
    """Stores the value and notes the flag in ``args.dnas_flags_given``: the
    architecture functions fill in every default, so only this tells a flag
    typed on the command line from a default."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        setattr(namespace, GIVEN, sorted({*getattr(namespace, GIVEN, ()), option_string}))


def check_flags_apply(args) -> None:
    """BadFlag for a scheme flag given on the command line that the encoder's
    scheme does not read (e.g. --hybrid-init with DNAS: only HNAS has u)."""
    scheme = getattr(args, "encoder_attention_scheme", None)
    for flag in getattr(args, GIVEN, ()) or ():
        schemes = ONLY_FOR.get(flag)
        if schemes and scheme not in schemes:
            value = getattr(args, flag[2:].replace("-", "_"), None)
            raise BadFlag(
                f"{flag} {value} does nothing with a {scheme} encoder (--arch {getattr(args, 'arch', '?')}): it "
                f"applies to {' and '.join(schemes)} only; drop it, or choose that scheme "
                f"(--encoder-attention-scheme {schemes[-1]})"
            )


def add_scheme_args(parser, decoder: bool = True) -> None:
    """The attention-scheme flags (shared by transformer_dnas and roberta_dnas).
    Defaults are set in the architecture functions, as fairseq does."""
    parser.add_argument(
        "--encoder-attention-scheme", choices=SCHEMES,
        help="encoder self-attention normalization: unas (softmax over keys), "
             "dnas (doubly normalized, Algorithm 1) or hnas (learned mix of both)",
    )
    if decoder:
        parser.add_argument(
            "--decoder-attention-scheme", choices=SCHEMES,
            help="must stay unas: DNAS cannot run under incremental decoding",
        )
    parser.add_argument(
        "--sinkhorn-iters", type=int, metavar="N", action=_Given,
        help="column/row normalization rounds for DNAS/HNAS (1 = the paper's "
             "DNAS; more converge to a doubly-stochastic matrix)",
    )
    parser.add_argument(
        "--hybrid-init", type=float, metavar="U", action=_Given,
        help="HNAS only: initial weight u of DNAS, in (0, 1) (paper: 0.1 for "
             "Gigaword, 0.5 elsewhere)",
    )
    parser.add_argument(
        "--hybrid-weight-per", choices=HYBRID_PER, action=_Given,
        help="HNAS only: one trainable weight per head (the paper's u_l^h) or per layer",
    )


@register_model("transformer_dnas")
class TransformerDNASModel(TransformerModel):
    """fairseq's Transformer with a DNAS/HNAS/UNAS encoder and a UNAS decoder.

    With ``--encoder-attention-scheme unas`` it is exactly fairseq's
    ``transformer`` (same parameters, same code path).
    """

    @staticmethod
    def add_args(parser):
        TransformerModel.add_args(parser)
        add_scheme_args(parser)

    @classmethod
    def build_model(cls, args, task):
        dnas_base_architecture(args)
        validate_attention_args(args)
        return super().build_model(args, task)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return DNASTransformerEncoder(
            TransformerConfig.from_namespace(args), src_dict, embed_tokens
        )

    def hybrid_weights(self):
        """u per encoder layer and head as a (layers, heads) list of lists,
        or None unless the encoder is HNAS."""
        return self.encoder.hybrid_weights()

    def upgrade_state_dict_named(self, state_dict, name):
        missing = missing_hybrid_keys(self, state_dict, name)
        super().upgrade_state_dict_named(state_dict, name)  # creates them (DNASMultiheadAttention)
        log_created_hybrid_logits(missing, getattr(self.args, "hybrid_init", None),
                                  fits=fits_but_hybrid(self, state_dict, name, missing))

    def set_num_updates(self, num_updates):
        """fairseq calls this before every training forward (``train_step``);
        log u here so that it appears in the training log and TensorBoard."""
        super().set_num_updates(num_updates)
        if self.training:
            log_hybrid_weights(self.encoder.attention_modules())


def missing_hybrid_keys(model, state_dict, name=""):
    """The ``...hybrid_logit`` keys the model has and ``state_dict`` lacks
    (a softmax checkpoint loaded into an HNAS model)."""
    prefix = name + "." if name else ""
    missing = []
    for module_name, m in model.named_modules():
        if isinstance(m, DNASMultiheadAttention) and m.hybrid_logit is not None:
            key = prefix + (module_name + "." if module_name else "") + "hybrid_logit"
            if key not in state_dict:
                missing.append(key)
    return missing


def fits_but_hybrid(model, state_dict, name, missing) -> bool:
    """Whether ``state_dict`` (after fairseq's upgrades) has every other
    parameter of ``model`` under ``name``: a checkpoint of the same model
    without HNAS weights, not one of another architecture (whose load fails
    next, naming the keys)."""
    prefix = name + "." if name else ""
    wanted = {prefix + key for key, _ in model.named_parameters()} - set(missing)
    return wanted <= set(state_dict)


def log_created_hybrid_logits(missing, hybrid_init, fits=True) -> None:
    """One line when the HNAS logits were created rather than loaded; none
    when the checkpoint does not fit otherwise (its load fails next)."""
    if missing and fits:
        logger.info(
            f"the checkpoint has no HNAS weights: created {len(missing)} hybrid_logit "
            f"tensors at u = --hybrid-init {hybrid_init} (every other tensor is the checkpoint's)"
        )


def hybrid_metric_name(layer: int) -> str:
    """``hnas_u_L00``, ``hnas_u_L01``, ...: short, and they sort by layer."""
    return f"hnas_u_L{layer:02d}"


def log_hybrid_weights(modules) -> None:
    """Log u (Eq. 12) per encoder layer, mean over heads, as fairseq metrics.

    weight=0 keeps the latest value (as fairseq logs ``lr``): the u of the
    last forward of each log interval, i.e. the u behind the loss printed
    beside it. The value is a detached tensor, so there is no device sync
    until fairseq prints. Not all-reduced: u is a parameter, identical on
    every data-parallel worker, and rank 0 prints.
    """
    for layer, m in enumerate(modules):
        if m.hybrid_weight is not None:
            u = m.hybrid_weight.detach().mean()
            metrics.log_scalar(hybrid_metric_name(layer), u, weight=0, priority=900 + layer, round=4)


# --- architectures -----------------------------------------------------------


def _scheme_defaults(args, scheme, hybrid_init):
    args.encoder_attention_scheme = getattr(args, "encoder_attention_scheme", scheme)
    args.decoder_attention_scheme = getattr(args, "decoder_attention_scheme", "unas")
    args.sinkhorn_iters = getattr(args, "sinkhorn_iters", 1)
    args.hybrid_init = getattr(args, "hybrid_init", hybrid_init)
    args.hybrid_weight_per = getattr(args, "hybrid_weight_per", "head")


@register_model_architecture("transformer_dnas", "transformer_dnas")
def dnas_base_architecture(args):
    _scheme_defaults(args, "dnas", 0.5)
    base_architecture(args)


@register_model_architecture("transformer_dnas", "transformer_hnas")
def hnas_base_architecture(args):
    _scheme_defaults(args, "hnas", 0.5)
    base_architecture(args)


def gigaword_architecture(args):
    """The paper's Gigaword model (Section 6.3, Appendix D): 12 encoder and 12
    decoder layers, hidden 768, 12 heads, FFN 3072 (BERT-base sizes), word-piece
    embeddings shared between encoder, decoder and output, 128 source / 64
    target positions, learned positions and GELU as in BERT."""
    args.encoder_embed_dim = getattr(args, "encoder_embed_dim", 768)
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", 3072)
    args.encoder_layers = getattr(args, "encoder_layers", 12)
    args.encoder_attention_heads = getattr(args, "encoder_attention_heads", 12)
    args.encoder_learned_pos = getattr(args, "encoder_learned_pos", True)
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", 768)
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", 3072)
    args.decoder_layers = getattr(args, "decoder_layers", 12)
    args.decoder_attention_heads = getattr(args, "decoder_attention_heads", 12)
    args.decoder_learned_pos = getattr(args, "decoder_learned_pos", True)
    args.share_all_embeddings = getattr(args, "share_all_embeddings", True)
    args.activation_fn = getattr(args, "activation_fn", "gelu")
    args.dropout = getattr(args, "dropout", 0.1)
    args.attention_dropout = getattr(args, "attention_dropout", 0.1)
    args.max_source_positions = getattr(args, "max_source_positions", 128)
    args.max_target_positions = getattr(args, "max_target_positions", 64)
    base_architecture(args)


# The UNAS baseline of Table 3 is fairseq's own model at the same size.
register_model_architecture("transformer", "transformer_gigaword")(gigaword_architecture)


def _register_presets(scheme, hybrid_init_default):
    """``transformer_{scheme}_{preset}`` for fairseq's sized presets and Gigaword."""
    presets = {
        "iwslt_de_en": (transformer_iwslt_de_en, 0.5),
        "vaswani_wmt_en_de_big": (transformer_vaswani_wmt_en_de_big, 0.5),
        "gigaword": (gigaword_architecture, hybrid_init_default),
    }
    for preset, (sizes, hybrid_init) in presets.items():

        def arch(args, sizes=sizes, hybrid_init=hybrid_init):
            _scheme_defaults(args, scheme, hybrid_init)
            sizes(args)

        arch.__name__ = f"transformer_{scheme}_{preset}"
        arch.__doc__ = f"{scheme.upper()} encoder with the sizes of {sizes.__name__}."
        register_model_architecture("transformer_dnas", arch.__name__)(arch)


_register_presets("dnas", 0.5)
# Appendix D: HNAS weights start at 0.1 for Gigaword (the task favours UNAS).
_register_presets("hnas", 0.1)
