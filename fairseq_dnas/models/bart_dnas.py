"""``bart_dnas_*`` / ``bart_hnas_*`` (and ``mbart_*``): fairseq's BART whose
encoder self-attention is doubly-normalized (DNAS) or hybrid (HNAS); the
decoder (self- and cross-attention) stays fairseq's softmax.

Fine-tuning a pretrained BART with an HNAS encoder, as fairseq's
``examples/bart/README.summarization.md`` fine-tunes ``bart_large``:

    fairseq-train DATA-bin --user-dir fairseq_dnas --arch bart_hnas_large \\
        --restore-file bart.large/model.pt --reset-optimizer --reset-dataloader \\
        --reset-meters --task translation ...

Every pretrained weight loads where it was; the HNAS mixing logits, which a
softmax checkpoint lacks, start at ``--hybrid-init`` (one log line says so).
``--hybrid-init 0.01`` starts as close to the pretrained model as
u = sigmoid(logit) allows (docs/usage.md gives the distance in numbers).

Hooked as ``transformer_dnas`` hooks fairseq's Transformer: ``build_encoder``
returns the plugin's ``DNASTransformerEncoder``; everything else (BERT
initialization, classification heads, the dictionary-size upgrade, the hub
interface ``BARTModel.from_pretrained``) is fairseq's ``BARTModel``.
"""

from fairseq.models import register_model, register_model_architecture
from fairseq.models.bart import BARTModel
from fairseq.models.bart.model import (
    bart_base_architecture,
    bart_large_architecture,
    mbart_base_architecture,
    mbart_large_architecture,
)
from fairseq.models.transformer import TransformerConfig

from fairseq_dnas.models.transformer_dnas import (
    _scheme_defaults,
    add_scheme_args,
    fits_but_hybrid,
    log_created_hybrid_logits,
    log_hybrid_weights,
    missing_hybrid_keys,
    validate_attention_args,
)
from fairseq_dnas.modules import DNASTransformerEncoder


@register_model("bart_dnas")
class BARTDNASModel(BARTModel):
    """fairseq's BART with a UNAS/DNAS/HNAS encoder self-attention and a
    softmax decoder. With ``--encoder-attention-scheme unas`` it is exactly
    fairseq's ``bart`` (same parameters, same code path)."""

    @staticmethod
    def add_args(parser):
        BARTModel.add_args(parser)
        add_scheme_args(parser)

    @classmethod
    def build_model(cls, args, task):
        _scheme_defaults(args, "dnas", 0.5)  # only fills what the arch left unset
        validate_attention_args(args)
        return super().build_model(args, task)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return DNASTransformerEncoder(TransformerConfig.from_namespace(args), src_dict, embed_tokens)

    def upgrade_state_dict_named(self, state_dict, name):
        missing = missing_hybrid_keys(self, state_dict, name)
        super().upgrade_state_dict_named(state_dict, name)  # creates them (DNASMultiheadAttention)
        log_created_hybrid_logits(missing, getattr(self.args, "hybrid_init", None),
                                  fits=fits_but_hybrid(self, state_dict, name, missing))

    def attention_modules(self):
        """The encoder's DNASMultiheadAttention modules, bottom layer first."""
        return self.encoder.attention_modules()

    def hybrid_weights(self):
        """u per encoder layer and head as a (layers, heads) list of lists,
        or None unless the encoder is HNAS."""
        return self.encoder.hybrid_weights()

    def set_num_updates(self, num_updates):
        """Log u per layer with the training loss (as transformer_hnas does)."""
        super().set_num_updates(num_updates)
        if self.training:
            log_hybrid_weights(self.encoder.attention_modules())


# --- architectures -----------------------------------------------------------

SIZES = {
    "bart_{scheme}_base": bart_base_architecture,
    "bart_{scheme}_large": bart_large_architecture,
    "mbart_{scheme}_base": mbart_base_architecture,
    "mbart_{scheme}_large": mbart_large_architecture,
}


def _register(scheme, hybrid_init):
    """``bart_{scheme}_{base,large}``, ``mbart_{scheme}_{base,large}``: fairseq's
    sizes with the scheme's defaults. HNAS u starts at 0.5 (the paper outside
    Gigaword); ``--hybrid-init 0.01`` starts near the pretrained softmax model."""
    for pattern, sizes in SIZES.items():

        def arch(args, sizes=sizes):
            _scheme_defaults(args, scheme, hybrid_init)
            sizes(args)

        arch.__name__ = pattern.format(scheme=scheme)
        arch.__doc__ = f"{scheme.upper()} encoder with the sizes of {sizes.__name__}."
        register_model_architecture("bart_dnas", arch.__name__)(arch)


_register("dnas", 0.5)
_register("hnas", 0.5)
