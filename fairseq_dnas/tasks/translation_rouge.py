"""``translation_rouge``: fairseq's translation task plus ROUGE on the
validation set during training, the way ``--eval-bleu`` gives BLEU.

    fairseq-train DATA --user-dir fairseq_dnas --task translation_rouge \
        --eval-rouge --eval-rouge-remove-bpe sentencepiece \
        --eval-rouge-args '{"beam": 4, "max_len_b": 63}' \
        --eval-rouge-max-sentences 2000 --validate-interval-updates 2000 \
        --best-checkpoint-metric rouge1 --maximize-best-checkpoint-metric ...

At every validation it decodes (beam search, ``--eval-rouge-args``) the
validation pairs whose index is below ``--eval-rouge-max-sentences`` (all when
0), scores each hypothesis against its reference with ``rouge-score`` (Porter
stemming unless ``--eval-rouge-no-stemmer``) and logs ``rouge1``, ``rouge2``,
``rougeL``: mean F1 over the decoded sentences, in percent. Per-sentence sums
travel in the logging outputs, so the means are exact across batches and
across data-parallel workers. Any of them can select the best checkpoint.

The reference is the binarized target (after SentencePiece and truncation),
so these numbers track training; the test-set score that papers report is
fairseq_dnas/commands/rouge_eval.py against the raw reference file.
"""

import json
import logging
from argparse import Namespace
from dataclasses import dataclass, field
from typing import Optional

import torch
from fairseq import metrics, utils
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from fairseq_dnas.errors import BadFlag

logger = logging.getLogger(__name__)

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


@dataclass
class TranslationRougeConfig(TranslationConfig):
    eval_rouge: bool = field(
        default=False, metadata={"help": "decode the validation set and log ROUGE F1"}
    )
    eval_rouge_args: Optional[str] = field(
        default="{}",
        metadata={"help": 'generation args as JSON, e.g. \'{"beam": 4, "max_len_b": 63}\''},
    )
    eval_rouge_remove_bpe: Optional[str] = field(
        default=None,
        metadata={
            "help": "post-processing before scoring, e.g. sentencepiece (as --post-process)",
            "argparse_const": "sentencepiece",
        },
    )
    eval_rouge_no_stemmer: bool = field(
        default=False, metadata={"help": "score without Porter stemming"}
    )
    eval_rouge_max_sentences: int = field(
        default=0,
        metadata={"help": "decode only validation pairs with index < N (0: all); the "
                          "same pairs every time, whatever the batching"},
    )
    eval_rouge_print_samples: bool = field(
        default=False, metadata={"help": "log one hypothesis and reference per batch"}
    )


def select_rows(sample, keep, pad):
    """The part of a LanguagePairDataset batch where ``keep`` (B,) is True."""
    net_input = {k: (v[keep] if torch.is_tensor(v) and v.dim() > 0 else v)
                 for k, v in sample["net_input"].items()}
    return {
        "id": sample["id"][keep],
        "nsentences": int(keep.sum()),
        "ntokens": int(sample["target"][keep].ne(pad).sum()) if sample.get("target") is not None else 0,
        "net_input": net_input,
        "target": sample["target"][keep] if sample.get("target") is not None else None,
    }


@register_task("translation_rouge", dataclass=TranslationRougeConfig)
class TranslationRougeTask(TranslationTask):
    """Translation task that can log validation ROUGE (see module docstring)."""

    cfg: TranslationRougeConfig

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        if self.cfg.eval_rouge:
            from rouge_score import rouge_scorer

            if self.cfg.eval_rouge_max_sentences < 0:
                raise BadFlag(f"--eval-rouge-max-sentences must be >= 0 (0: the whole set); got "
                              f"{self.cfg.eval_rouge_max_sentences}")
            try:
                gen_args = json.loads(self.cfg.eval_rouge_args or "{}")
                if not isinstance(gen_args, dict):
                    raise ValueError("not an object")
            except ValueError as err:  # JSONDecodeError is a ValueError
                raise BadFlag(
                    f"--eval-rouge-args must be a JSON object such as "
                    f"'{{\"beam\": 4}}'; got {self.cfg.eval_rouge_args!r} ({err})"
                ) from None
            self.rouge_generator = self.build_generator([model], Namespace(**gen_args))
            self.rouge_scorer = rouge_scorer.RougeScorer(
                list(ROUGE_TYPES), use_stemmer=not self.cfg.eval_rouge_no_stemmer
            )
        return model

    def valid_step(self, sample, model, criterion):
        loss, sample_size, logging_output = super().valid_step(sample, model, criterion)
        if self.cfg.eval_rouge:
            sums = self._rouge_sums(sample, model)
            # Always the same keys, even for nothing decoded: fairseq sums
            # logging outputs across workers key by key.
            logging_output["_rouge_n"] = sums["n"]
            for t in ROUGE_TYPES:
                logging_output[f"_{t}_sum"] = sums[t]
        return loss, sample_size, logging_output

    def _rouge_sums(self, sample, model):
        sums = {"n": 0, **{t: 0.0 for t in ROUGE_TYPES}}
        if sample is None or sample.get("target") is None:
            return sums
        limit = self.cfg.eval_rouge_max_sentences
        if limit:
            keep = sample["id"] < limit
            if not keep.any():
                return sums
            if not keep.all():
                sample = select_rows(sample, keep, self.tgt_dict.pad())
        hyps, refs = self.decode_batch(sample, model)
        for hyp, ref in zip(hyps, refs):
            scores = self.rouge_scorer.score(ref, hyp)
            for t in ROUGE_TYPES:
                sums[t] += scores[t].fmeasure
        sums["n"] = len(hyps)
        if self.cfg.eval_rouge_print_samples and hyps:
            logger.info("example hypothesis: " + hyps[0])
            logger.info("example reference: " + refs[0])
        return sums

    def decode_batch(self, sample, model):
        """Beam-search the batch; return (hypotheses, references) as text."""

        def to_text(tokens):
            return self.tgt_dict.string(
                tokens.int().cpu(), self.cfg.eval_rouge_remove_bpe, unk_string="UNK"
            )

        gen_out = self.inference_step(self.rouge_generator, [model], sample)
        hyps = [to_text(out[0]["tokens"]) for out in gen_out]
        refs = [to_text(utils.strip_pad(t, self.tgt_dict.pad())) for t in sample["target"]]
        return hyps, refs

    def reduce_metrics(self, logging_outputs, criterion):
        super().reduce_metrics(logging_outputs, criterion)
        # Only validation outputs carry the sums (training steps call this too).
        if not self.cfg.eval_rouge or not any("_rouge_n" in log for log in logging_outputs):
            return

        def total(key):
            value = sum(log.get(key, 0) for log in logging_outputs)
            return value.item() if torch.is_tensor(value) else value

        metrics.log_scalar_sum("_rouge_n", total("_rouge_n"))
        for t in ROUGE_TYPES:
            metrics.log_scalar_sum(f"_{t}_sum", total(f"_{t}_sum"))

            def mean_f1(meters, t=t):
                n = meters["_rouge_n"].sum
                return round(100.0 * meters[f"_{t}_sum"].sum / n, 2) if n > 0 else 0.0

            metrics.log_derived(t, mean_f1)
