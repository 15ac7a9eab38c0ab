"""``roberta_dnas`` / ``roberta_hnas``: fairseq's RoBERTa (masked-LM encoder,
``--task masked_lm`` and ``--task sentence_prediction``) whose every encoder
self-attention layer is doubly-normalized (DNAS) or hybrid (HNAS): the
paper's BERT experiment (Ding et al., 2020, Section 6.2, Table 2, Figure 4).

    fairseq-train DATA --user-dir fairseq_dnas --task masked_lm \\
        --arch roberta_hnas_small --sample-break-mode complete ...

Hooked as fairseq's own Linformer example hooks RoBERTa
(``examples/linformer/linformer_src``): ``build_model`` builds a
``RobertaEncoder`` subclass whose ``build_encoder`` returns the plugin's
``DNASTransformerEncoder`` (fairseq's encoder with ``build_encoder_layer`` ->
``build_self_attention`` swapped). Everything else (embeddings, LM head,
classification heads, checkpoint upgrades) is fairseq's ``RobertaModel``.

With ``--encoder-attention-scheme unas`` the model is exactly fairseq's
``roberta`` (same parameters in the same order, same outputs), and a plain
``roberta`` checkpoint loads into ``roberta_hnas`` with u at ``--hybrid-init``
(``DNASMultiheadAttention.upgrade_state_dict_named``).
"""

from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta import RobertaEncoder, RobertaModel
from fairseq.models.roberta.model import base_architecture, roberta_large_architecture
from fairseq.models.transformer import TransformerConfig
from fairseq.modules.transformer_sentence_encoder import init_bert_params
from fairseq.utils import safe_getattr, safe_hasattr

from fairseq_dnas.models.transformer_dnas import (
    _scheme_defaults,
    add_scheme_args,
    log_hybrid_weights,
    validate_attention_args,
)
from fairseq_dnas.modules import DNASTransformerEncoder


class DNASRobertaEncoder(RobertaEncoder):
    """fairseq's RoBERTa encoder around a ``stack_class`` encoder
    (``DNASTransformerEncoder`` here)."""

    stack_class = DNASTransformerEncoder

    def build_encoder(self, args, dictionary, embed_tokens):
        # As RobertaEncoder.build_encoder, with the plugin's encoder.
        encoder = self.stack_class(TransformerConfig.from_namespace(args), dictionary, embed_tokens)
        encoder.apply(init_bert_params)
        return encoder


def build_roberta(cls, args, task, encoder_class, defaults, validate):
    """RobertaModel.build_model (which names RobertaEncoder itself) with the
    plugin's ``encoder_class``, its defaults and its flag checks."""
    from omegaconf import OmegaConf

    if OmegaConf.is_config(args):
        OmegaConf.set_struct(args, False)
    defaults(args)
    validate(args)
    if not safe_hasattr(args, "max_positions"):
        if not safe_hasattr(args, "tokens_per_sample"):
            args.tokens_per_sample = task.max_positions()
        args.max_positions = args.tokens_per_sample
    encoder = encoder_class(args, task.source_dictionary)
    if OmegaConf.is_config(args):
        OmegaConf.set_struct(args, True)
    return cls(args, encoder)


@register_model("roberta_dnas")
class RobertaDNASModel(RobertaModel):
    """fairseq's RoBERTa with a UNAS/DNAS/HNAS encoder self-attention."""

    @staticmethod
    def add_args(parser):
        RobertaModel.add_args(parser)
        add_scheme_args(parser, decoder=False)

    @classmethod
    def build_model(cls, args, task):
        return build_roberta(cls, args, task, DNASRobertaEncoder, roberta_dnas_architecture, validate_attention_args)

    def attention_modules(self):
        """The encoder's DNASMultiheadAttention modules, bottom layer first."""
        return self.encoder.sentence_encoder.attention_modules()

    def hybrid_weights(self):
        """u per encoder layer and head as a (layers, heads) list of lists,
        or None unless the encoder is HNAS."""
        return self.encoder.sentence_encoder.hybrid_weights()

    def set_num_updates(self, num_updates):
        """Log u per layer with the training loss (as transformer_hnas does)."""
        super().set_num_updates(num_updates)
        if self.training:
            log_hybrid_weights(self.attention_modules())


# --- architectures -----------------------------------------------------------


def small_architecture(args):
    """A CPU-sized encoder for the recipe: 4 layers, 128 wide, 4 heads, FFN
    512, 128 positions (0.8M parameters besides the embeddings)."""
    args.encoder_layers = safe_getattr(args, "encoder_layers", 4)
    args.encoder_embed_dim = safe_getattr(args, "encoder_embed_dim", 128)
    args.encoder_ffn_embed_dim = safe_getattr(args, "encoder_ffn_embed_dim", 512)
    args.encoder_attention_heads = safe_getattr(args, "encoder_attention_heads", 4)
    args.max_positions = safe_getattr(args, "max_positions", 128)
    base_architecture(args)


def bert_paper_architecture(args):
    """The paper's BERT (Section 6.2, Table 2): 24 layers, 1,024 wide, 16 heads,
    FFN 4,096, 512 positions: the sizes of fairseq's roberta_large."""
    roberta_large_architecture(args)


# fairseq's own roberta at the small size: the UNAS baseline of the recipe.
register_model_architecture("roberta", "roberta_small")(small_architecture)


def thesis_architecture(args):
    """The thesis's classifier (Section 5.3): 6 layers, d_model 64, d_ff 128,
    4 heads; RoBERTa's other settings (post-norm, GELU, 512 positions)."""
    sizes = dict(encoder_layers=6, encoder_embed_dim=64, encoder_ffn_embed_dim=128, encoder_attention_heads=4)
    for name, value in sizes.items():  # unless set on the command line
        setattr(args, name, safe_getattr(args, name, value))
    base_architecture(args)


# fairseq's own roberta at the thesis's size: the TRANSFORMER baseline of Section 6.1.
register_model_architecture("roberta", "roberta_thesis")(thesis_architecture)


PRESETS = {
    "": base_architecture,
    "base": base_architecture,
    "large": roberta_large_architecture,
    "bert": bert_paper_architecture,
    "small": small_architecture,
}


@register_model_architecture("roberta_dnas", "roberta_dnas")
def roberta_dnas_architecture(args):
    _scheme_defaults(args, "dnas", 0.5)
    base_architecture(args)


@register_model_architecture("roberta_dnas", "roberta_hnas")
def roberta_hnas_architecture(args):
    _scheme_defaults(args, "hnas", 0.5)
    base_architecture(args)


def _register_presets(scheme):
    """``roberta_{scheme}_{base,large,bert,small}``; HNAS u starts at 0.5 (the
    paper's setting outside Gigaword)."""
    for preset, sizes in PRESETS.items():
        if not preset:
            continue

        def arch(args, sizes=sizes):
            _scheme_defaults(args, scheme, 0.5)
            sizes(args)

        arch.__name__ = f"roberta_{scheme}_{preset}"
        arch.__doc__ = f"{scheme.upper()} encoder with the sizes of {sizes.__name__}."
        register_model_architecture("roberta_dnas", arch.__name__)(arch)


_register_presets("dnas")
_register_presets("hnas")
