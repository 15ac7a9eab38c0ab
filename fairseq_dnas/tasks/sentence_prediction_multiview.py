"""``--task sentence_prediction_multiview`` and ``--criterion
sentence_prediction_multiview``: classification of paired views of one
example (J. Kinley, 2020, Section 5.3: an arithmetic expression in infix and
in prefix order, one label), for the multiview two-stream models
(``roberta_two_stream_multiview``, ``roberta_discrete_multiview``).

Data, as fairseq's ``sentence_prediction`` binarizes it: ``DATA/input0``
(view 0), ``DATA/input1`` (view 1, binarized with input0's dictionary:
``fairseq-preprocess --srcdict input0/dict.txt``) and ``DATA/label``. Each
view is its own sequence (fairseq's task would concatenate input0 and input1
into one sentence pair); each gets ``--init-token`` first.

Loss: the sum of the two views' cross-entropies, CE(view 0) + CE(view 1),
each weighted 1 (the thesis optimizes "the Cross-Entropy Loss for each"):
both views carry the same label and neither is the main task, so neither is
preferred; fairseq divides by the number of examples, so the loss is the
per-example sum of the two views' mean cross-entropies.
"""

import logging
import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from fairseq.criterions import register_criterion
from fairseq.criterions.sentence_prediction import SentencePredictionConfig, SentencePredictionCriterion
from fairseq.data import (
    IdDataset,
    NestedDictionaryDataset,
    NumelDataset,
    NumSamplesDataset,
    OffsetTokensDataset,
    PrependTokenDataset,
    RightPadDataset,
    SortDataset,
    StripTokenDataset,
    data_utils,
)
from fairseq.data.shorten_dataset import maybe_shorten_dataset
from fairseq.logging import metrics
from fairseq.tasks import register_task
from fairseq.tasks.sentence_prediction import SentencePredictionConfig as TaskConfig
from fairseq.tasks.sentence_prediction import SentencePredictionTask

from fairseq_dnas.criterions.receptive_field_penalty import register_penalized
from fairseq_dnas.errors import BadFile, BadFlag
from fairseq_dnas.models.roberta_two_stream import view_head_names

logger = logging.getLogger(__name__)

VIEWS = ("input0", "input1")


@dataclass
class MultiviewTaskConfig(TaskConfig):
    pass


@register_task("sentence_prediction_multiview", dataclass=MultiviewTaskConfig)
class SentencePredictionMultiviewTask(SentencePredictionTask):
    """Two views per example, one label; registers one classification head per view."""

    multiview = True  # what the multiview models check

    @classmethod
    def setup_task(cls, cfg, **kwargs):
        if cfg.regression_target:
            raise BadFlag("--task sentence_prediction_multiview classifies; drop --regression-target")
        for view in VIEWS:
            folder = os.path.join(str(cfg.data).split(os.pathsep)[0], view)
            if not os.path.isdir(folder):
                raise BadFlag(
                    f"--task sentence_prediction_multiview needs both views, and {folder} is missing: "
                    "binarize view 0 into DATA/input0 and view 1 into DATA/input1 "
                    "(fairseq-preprocess --srcdict input0/dict.txt), or use --task sentence_prediction"
                )
        return super().setup_task(cfg, **kwargs)

    def _view(self, key, split, combine):
        path = os.path.join(self.cfg.data, key, split)
        dataset = data_utils.load_indexed_dataset(path, self.source_dictionary, combine=combine)
        if dataset is None:
            raise BadFile(path, f"no binarized {split} split of view {key} (both input0 and input1 need it)")
        if self.cfg.init_token is not None:
            dataset = PrependTokenDataset(dataset, self.cfg.init_token)
        return maybe_shorten_dataset(dataset, split, self.cfg.shorten_data_split_list, self.cfg.shorten_method,
                                     self.max_positions(), self.cfg.seed)

    def load_dataset(self, split, combine=False, **kwargs):
        views = [self._view(key, split, combine) for key in VIEWS]
        if len(views[0]) != len(views[1]):
            raise BadFile(os.path.join(self.cfg.data, "input1", split),
                          f"{len(views[1])} examples, but input0 has {len(views[0])}: the views must be parallel")
        label_path = os.path.join(self.cfg.data, "label", split)
        labels = data_utils.load_indexed_dataset(label_path, self.label_dictionary, combine=combine)
        if labels is None:
            raise BadFile(label_path, f"no binarized {split} split of the labels")
        pad = self.source_dictionary.pad()
        dataset = {
            "id": IdDataset(),
            "net_input": {"src_tokens": RightPadDataset(views[0], pad_idx=pad),
                          "src_lengths": NumelDataset(views[0], reduce=False)},
            "net_input1": {"src_tokens": RightPadDataset(views[1], pad_idx=pad),
                           "src_lengths": NumelDataset(views[1], reduce=False)},
            "nsentences": NumSamplesDataset(),
            "ntokens": NumelDataset(views[0], reduce=True),
            "target": OffsetTokensDataset(StripTokenDataset(labels, id_to_strip=self.label_dictionary.eos()),
                                          offset=-self.label_dictionary.nspecial),
        }
        # One size per example, the longer view's: what batching and --max-positions filter by.
        nested = NestedDictionaryDataset(dataset, sizes=[np.maximum(views[0].sizes, views[1].sizes)])
        if not self.cfg.no_shuffle:
            with data_utils.numpy_seed(self.cfg.seed):
                nested = SortDataset(nested, sort_order=[np.random.permutation(len(nested))])
        logger.info("Loaded %s with #samples: %d (two views)", split, len(nested))
        self.datasets[split] = nested
        return nested

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)  # registers view 0's head
        model.register_classification_head(view_head_names(self.cfg.classification_head_name)[1],
                                           num_classes=self.cfg.num_classes)
        return model


@register_criterion("sentence_prediction_multiview", dataclass=SentencePredictionConfig)
class SentencePredictionMultiviewCriterion(SentencePredictionCriterion):
    """CE(view 0) + CE(view 1), summed over the examples (weights 1, 1)."""

    def forward(self, model, sample, reduce=True):
        heads = view_head_names(self.classification_head_name)
        targets = sample["target"].view(-1)
        log = {"ntokens": sample["ntokens"], "nsentences": targets.numel(), "sample_size": targets.numel()}
        loss = 0.0
        for view, (inputs, head) in enumerate(zip(("net_input", "net_input1"), heads)):
            logits, _ = model(**sample[inputs], features_only=True, classification_head_name=head, view=view)
            view_loss = F.nll_loss(F.log_softmax(logits, dim=-1, dtype=torch.float32), targets, reduction="sum")
            loss = loss + view_loss
            suffix = "" if view == 0 else "_view1"
            log[f"loss_view{view}"] = view_loss.data
            log[f"ncorrect{suffix}"] = (logits.argmax(dim=1) == targets).sum()
        log["loss"] = loss.data
        return loss, targets.numel(), log

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        """fairseq's (loss, accuracy = view 0's), plus accuracy_view1 and each view's loss."""
        SentencePredictionCriterion.reduce_metrics(logging_outputs)
        nsentences = sum(log.get("nsentences", 0) for log in logging_outputs)
        if nsentences == 0:
            return
        ncorrect = sum(log.get("ncorrect_view1", 0) for log in logging_outputs)
        metrics.log_scalar("accuracy_view1", 100.0 * ncorrect / nsentences, nsentences, round=1)
        for view in (0, 1):
            total = sum(log.get(f"loss_view{view}", 0) for log in logging_outputs)
            metrics.log_scalar(f"loss_view{view}", total / nsentences / np.log(2), nsentences, round=3)


# --criterion sentence_prediction_multiview_rf_penalty: both views' fields penalized.
register_penalized("sentence_prediction_multiview")
