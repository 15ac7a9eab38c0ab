"""Two-stream encoders for classification (J. Kinley, 2020, Section 5.3):
fairseq's RoBERTa (``--task sentence_prediction``: a classification token
first, a head on the model stream h at that token) with a two-stream encoder
(``fairseq_dnas.modules.two_stream``).

- ``roberta_discrete``: the two-stream discrete model (S sampled from the
  controller's logits; argmax at inference);
- ``roberta_two_stream``: the soft variant (S = A);
- ``roberta_two_stream_multiview`` / ``roberta_discrete_multiview``: the
  thesis's multiview model (Section 5.3, Table 6.5): two controllers, one per
  view, share one model stream (and its embeddings); each controller has its
  own embeddings unless ``--share-stream-embeddings``; one classification
  head per view; trained with ``--task
  sentence_prediction_multiview`` (``fairseq_dnas.tasks.sentence_prediction_multiview``).

Each with ``_small`` (the recipe's CPU size) and ``_thesis`` (6 layers, 64
wide, FFN 128, 4 heads: Section 5.3) sizes.

    fairseq-train DATA --user-dir fairseq_dnas --task sentence_prediction \\
        --arch roberta_discrete_thesis --num-classes 2 --init-token 0 ...

Hooked as ``roberta_dnas`` is: a ``RobertaEncoder`` subclass whose
``build_encoder`` returns the two-stream encoder; heads, embeddings and
checkpoint upgrades are fairseq's ``RobertaModel``.
"""

from fairseq.models import register_model
from fairseq.models.roberta import RobertaEncoder, RobertaModel
from fairseq.models.roberta.model import base_architecture
from fairseq.models.transformer import TransformerConfig
from fairseq.modules.transformer_sentence_encoder import init_bert_params
from fairseq.utils import safe_getattr
from torch import nn

from fairseq_dnas.errors import BadFlag
from fairseq_dnas.models.discrete_args import apply_temperature
from fairseq_dnas.models.roberta_dnas import build_roberta, small_architecture, thesis_architecture
from fairseq_dnas.models.transformer_two_stream import (
    TwoStreamModelMixin,
    add_two_stream_args,
    register_sized,
    two_stream_defaults,
    validate_two_stream_args,
)
from fairseq_dnas.modules.two_stream import TwoStreamEncoder, share_model_stream

MULTIVIEW_TASK = "sentence_prediction_multiview"


class TwoStreamRobertaEncoder(RobertaEncoder):
    """fairseq's RoBERTa encoder around a ``TwoStreamEncoder``; the LM head
    and the classification heads read the model stream."""

    def build_encoder(self, args, dictionary, embed_tokens):
        controller = None  # --share-stream-embeddings: the controller reads the model stream's embedding
        if not args.share_stream_embeddings:  # its own first layer (thesis Section 4.2)
            controller = self.build_embedding(len(dictionary), args.encoder_embed_dim, dictionary.pad())
        encoder = TwoStreamEncoder(TransformerConfig.from_namespace(args), dictionary, embed_tokens,
                                   controller_embed_tokens=controller)
        encoder.apply(init_bert_params)
        return encoder


class MultiviewRobertaEncoder(TwoStreamRobertaEncoder):
    """Two view encoders: ``sentence_encoder`` (view 0) and
    ``second_view_encoder`` (view 1) with their own controllers (layers and,
    by default, embeddings) and the same model stream modules
    (``share_model_stream``). ``view=`` picks one."""

    def __init__(self, args, dictionary):
        super().__init__(args, dictionary)
        self.second_view_encoder = self.build_encoder(args, dictionary, self.sentence_encoder.embed_tokens)
        share_model_stream(self.sentence_encoder, self.second_view_encoder)

    def forward(self, src_tokens, features_only=False, return_all_hiddens=False, masked_tokens=None,
                view: int = 0, **unused):
        if view not in (0, 1):
            raise ValueError(f"view must be 0 or 1; got {view!r}")
        encoder = self.sentence_encoder if view == 0 else self.second_view_encoder
        out = encoder(src_tokens, return_all_hiddens=return_all_hiddens)
        x = out["encoder_out"][0].transpose(0, 1)
        extra = {"inner_states": out["encoder_states"] if return_all_hiddens else None}
        if not features_only:
            x = self.output_layer(x, masked_tokens=masked_tokens)
        return x, extra


PARAM_INITS = ("bert", "pytorch")


def pytorch_init(model):
    """PyTorch's own initialisation of every Linear and Embedding in place of
    fairseq's ``init_bert_params`` (N(0, 0.02), tuned for 768-wide models):
    Linear Kaiming-uniform (std about 0.07 at 64 inputs), Embedding N(0, 1)
    with the padding row 0. At the thesis's 64 wide, N(0, 0.02) keeps the
    attention logits near 0, and the arithmetic task stays at the majority
    answer far longer. LayerNorms and other parameters are left as built."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.reset_parameters()


def _build(cls, args, task, encoder_cls):
    """fairseq's RobertaModel.build_model with the two-stream encoder; tau set for update 0."""

    def defaults(args):
        two_stream_defaults(args, "gumbel")
        args.param_init = safe_getattr(args, "param_init", "bert")
        base_architecture(args)

    model = build_roberta(cls, args, task, encoder_cls, defaults, validate_two_stream_args)
    if args.param_init == "pytorch":
        pytorch_init(model)
    apply_temperature(model, args, 0, log=False)
    return model


@register_model("roberta_two_stream")
class RobertaTwoStreamModel(TwoStreamModelMixin, RobertaModel):
    """fairseq's RoBERTa with a two-stream encoder."""

    @staticmethod
    def add_args(parser):
        RobertaModel.add_args(parser)
        add_two_stream_args(parser)
        parser.add_argument("--param-init", choices=PARAM_INITS,
                            help="bert (default): fairseq's init_bert_params, N(0, 0.02) weights; pytorch: "
                                 "each Linear and Embedding's own reset_parameters (Kaiming-uniform, N(0, 1)), "
                                 "which leaves the arithmetic plateau much sooner at 64 wide "
                                 "(docs/results/2026-11-27-cpu-table65-learnability.md)")

    @classmethod
    def build_model(cls, args, task):
        return _build(cls, args, task, TwoStreamRobertaEncoder)


@register_model("roberta_two_stream_multiview")
class RobertaMultiviewModel(RobertaTwoStreamModel):
    """Two controllers (one per view) over one model stream (thesis Section
    5.3); one classification head per view (``view_head_names``)."""

    @classmethod
    def build_model(cls, args, task):
        if not getattr(task, "multiview", False):
            raise BadFlag(
                f"--arch {args.arch} reads two views of each example; use --task {MULTIVIEW_TASK} "
                "(DATA/input0, DATA/input1, DATA/label)"
            )
        return _build(cls, args, task, MultiviewRobertaEncoder)


def view_head_names(name: str):
    """The classification heads of the two views: ``<name>`` for view 0 (so
    the model is also a plain classifier of view 0) and ``<name>_view1``."""
    return name, f"{name}_view1"


# --- architectures -----------------------------------------------------------


PRESETS = (("", base_architecture), ("_small", small_architecture), ("_thesis", thesis_architecture))
register_sized("roberta_two_stream", "roberta_discrete", "gumbel", PRESETS)
register_sized("roberta_two_stream", "roberta_two_stream", "soft", PRESETS)
register_sized("roberta_two_stream_multiview", "roberta_discrete_multiview", "gumbel", PRESETS)
register_sized("roberta_two_stream_multiview", "roberta_two_stream_multiview", "soft", PRESETS)
