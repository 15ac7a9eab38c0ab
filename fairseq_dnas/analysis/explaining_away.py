"""Run a model over a binarized split and collect sum_i pi_ij for every
attention module (Definition 1, Theorem 2, Figure 1 of the paper).

An encoder-decoder model runs as in training, with teacher forcing (the
reference target is the decoder input), in eval mode (no dropout). An
encoder-only RoBERTa model (``roberta``, ``roberta_dnas``) reads each
sentence of the split as ``<s> sentence </s>``, unmasked (``EncoderInputs``),
and has encoder self-attention only. Three kinds of attention:

- encoder self-attention: UNAS, DNAS or HNAS, whatever the model uses; the
  sum runs over the real source positions (padding excluded);
- decoder cross-attention: UNAS; queries are the real target positions, keys
  the real source positions, so a source token with a tiny sum is one the
  decoder ignores;
- decoder self-attention: UNAS and causal, so key j can only receive
  attention from the queries i >= j (the last target position from itself
  alone); small sums there partly reflect the mask, not only explaining away.
"""

import os
from typing import Callable, Dict, List, Optional, Tuple

import torch

from fairseq_dnas.analysis.capture import (
    TWO_STREAM,
    Hooks,
    Site,
    attention_sites,
    call_kwargs,
    check_same_output,
    encoder_stack,
    head_probs,
    is_encoder_only,
    site_components,
    two_stream_attention,
)
from fairseq_dnas.analysis.column_sums import EPSILON, ColumnStats, column_sums



class SplitError(ValueError):
    """A data split that cannot be analysed (missing, empty)."""


class ColumnSumRecorder(Hooks):
    """While active (``with``), every forward of ``model`` adds sum_i pi_ij of
    each attention module to ``self.stats[(kind, layer, component)]``."""

    def __init__(self, model, decoder: bool = True, components: bool = True, epsilon: float = EPSILON):
        self.model = model
        self.sites = attention_sites(model, decoder=decoder)
        self.components = components
        self.epsilon = epsilon
        self.stats: Dict[Tuple[str, int, str], ColumnStats] = {}
        self._pad = {}
        super().__init__()

    def __enter__(self):
        enc, dec = encoder_stack(self.model), getattr(self.model, "decoder", None)
        # Padding masks of the whole batch, from the token ids themselves.
        self._handles.append(enc.register_forward_pre_hook(self._pad_hook("src", enc.padding_idx), with_kwargs=True))
        if dec is not None:
            self._handles.append(dec.register_forward_pre_hook(self._pad_hook("tgt", dec.padding_idx), with_kwargs=True))
        for site in self.sites:
            if site.scheme == TWO_STREAM:
                self._handles.append(site.module.attention_tap.register_forward_hook(self._tap_hook(site)))
            else:
                self._handles.append(site.module.register_forward_hook(self._site_hook(site), with_kwargs=True))
        return self

    def _pad_hook(self, name, padding_idx):
        def hook(module, args, kwargs):
            tokens = args[0] if args else kwargs.get("src_tokens", kwargs.get("prev_output_tokens"))
            self._pad[name] = tokens.eq(padding_idx)

        return hook

    def _masks(self, kind):
        src, tgt = self._pad.get("src"), self._pad.get("tgt")
        return {"encoder_self": (src, src), "decoder_self": (tgt, tgt), "decoder_cross": (tgt, src)}[kind]

    def _site_hook(self, site: Site):
        def hook(module, args, kwargs, output):
            call = call_kwargs(args, kwargs)
            out, probs = head_probs(module, call)
            check_same_output(out, output[0], f"{site.kind} layer {site.layer}")
            query_pad, key_pad = self._masks(site.kind)
            self._add(site, "mixture" if site.scheme == "hnas" else site.scheme, probs, query_pad, key_pad)
            if site.scheme == "hnas" and self.components:
                for comp in ("dnas", "unas"):
                    self._add(site, comp, head_probs(module, call, scheme=comp)[1], query_pad, key_pad)

        return hook

    def _tap_hook(self, site: Site):
        """A two-stream module: its A and S as it used them (capture.two_stream_attention)."""
        def hook(module, args, output):
            query_pad, key_pad = self._masks(site.kind)
            for component, probs in two_stream_attention(args).items():
                self._add(site, component, probs, query_pad, key_pad)

        return hook

    def _add(self, site, component, probs, query_pad, key_pad):
        heads, batch, t_q, t_k = probs.shape
        for mask, t in ((query_pad, t_q), (key_pad, t_k)):
            if mask is not None and tuple(mask.shape) != (batch, t):
                raise RuntimeError(f"padding mask {tuple(mask.shape)} does not fit attention {tuple(probs.shape)}")
        key = (site.kind, site.layer, component)
        if key not in self.stats:
            self.stats[key] = ColumnStats(heads, self.epsilon)
        self.stats[key].add(*column_sums(probs, query_pad, key_pad))


def _refuse_empty(folder: str, subset: str) -> None:
    """fairseq cannot even open an empty binarized split (mmap of 0 bytes)."""
    files = os.listdir(folder) if os.path.isdir(folder) else []
    bins = [f for f in files if f.startswith(subset + ".") and f.endswith(".bin")]
    if bins and all(os.path.getsize(os.path.join(folder, f)) == 0 for f in bins):
        raise _empty(subset, folder)


def _empty(subset: str, folder: str) -> SplitError:
    return SplitError(f"split '{subset}' in {folder} is empty (0 sentences); choose another with --subset")


def _splits_found(folder: str) -> str:
    files = os.listdir(folder) if os.path.isdir(folder) else []
    return ", ".join(sorted({f.split(".")[0] for f in files if f.endswith(".idx")})) or "none"


def load_split(task, subset: str, data: str):
    """Load ``subset`` of the binarized folder ``data``; SplitError if it is
    missing or empty. For an encoder-only task (masked_lm, sentence_prediction)
    the sentences as RoBERTa reads them (``EncoderInputs``)."""
    folder = sentence_folder(task)
    if folder is not None:
        return load_encoder_inputs(task, subset, folder)
    _refuse_empty(data, subset)
    try:
        task.load_dataset(subset, combine=False, epoch=1)
    except FileNotFoundError:
        raise SplitError(
            f"split '{subset}' not found in {data} (fairseq-preprocess writes "
            f"{subset}.<src>-<tgt>.<lang>.bin/.idx there); splits found: "
            f"{_splits_found(data)}. Choose one with --subset."
        ) from None
    dataset = task.dataset(subset)
    if len(dataset) == 0:
        raise _empty(subset, data)
    return dataset


# --- encoder-only models (RoBERTa) ---------------------------------------------


def sentence_folder(task) -> Optional[str]:
    """Where an encoder-only task keeps its binarized sentences: the data
    folder of ``masked_lm``, ``input0/`` of ``sentence_prediction``; None for
    any other task (translation)."""
    from fairseq import utils
    from fairseq.tasks.masked_lm import MaskedLMTask
    from fairseq.tasks.sentence_prediction import SentencePredictionTask

    if isinstance(task, MaskedLMTask):
        return utils.split_paths(task.cfg.data)[0]
    if isinstance(task, SentencePredictionTask):
        return os.path.join(utils.split_paths(task.cfg.data)[0], "input0")
    return None


class EncoderInputs:
    """The sentences of a binarized ``--only-source`` split as RoBERTa reads
    them, unmasked: ``<s> sentence </s>`` (fairseq-preprocess ends every line
    with ``</s>``; ``<s>`` is prepended as ``masked_lm`` does, or
    ``sentence_prediction`` with ``--init-token 0``), one line of the text per
    input, padded on the right. ``src_sizes`` count ``<s>`` and ``</s>``, so
    they compare with the model's maximum positions. ``init_token`` None:
    nothing before the sentence (a sentence_prediction model fine-tuned
    without --init-token)."""

    def __init__(self, sentences, dictionary, folder: str = "", init_token: Optional[int] = None):
        from fairseq.data import PrependTokenDataset

        self.folder = folder
        self.pad = dictionary.pad()
        self.init_token = init_token
        first = "" if init_token is None else dictionary[init_token] + " "
        self.shape = f"{first}sentence {dictionary[dictionary.eos()]}"  # e.g. '<s> sentence </s>'
        self.tokens = PrependTokenDataset(sentences, self.init_token)
        self.src_sizes = self.tokens.sizes
        self.tgt_sizes = None

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, index):
        return self.tokens[index]

    def collater(self, samples):
        from fairseq.data import data_utils

        tokens = data_utils.collate_tokens(samples, self.pad, left_pad=False)
        return {"net_input": {"src_tokens": tokens, "src_lengths": tokens.ne(self.pad).sum(1)}}


def load_encoder_inputs(task, subset: str, folder: str) -> EncoderInputs:
    """``folder/subset`` read with the task's dictionary; SplitError if missing or empty."""
    from fairseq.data import data_utils

    _refuse_empty(folder, subset)
    sentences = data_utils.load_indexed_dataset(os.path.join(folder, subset), task.source_dictionary,
                                                combine=False)
    if sentences is None:
        raise SplitError(
            f"split '{subset}' not found in {folder} (fairseq-preprocess --only-source writes "
            f"{subset}.bin/.idx there); splits found: {_splits_found(folder)}. Choose one with --subset."
        )
    if len(sentences) == 0:
        raise _empty(subset, folder)
    return EncoderInputs(sentences, task.source_dictionary, folder, init_token(task))


def init_token(task) -> Optional[int]:
    """The token put before each sentence: <s> for masked_lm; for
    sentence_prediction its --init-token (the recipes give 0, <s>), or None
    (nothing) when the model was fine-tuned without one."""
    from fairseq.tasks.sentence_prediction import SentencePredictionTask

    if isinstance(task, SentencePredictionTask):
        return task.cfg.init_token
    return task.source_dictionary.bos()


def batches(dataset, max_positions, batch_size: int, max_sentences: Optional[int]):
    """Batches over the first ``max_sentences`` sentences (by id, not by length,
    so a limit does not pick the short ones); too-long pairs are skipped.

    Returns (list of index lists, number analysed, number skipped).
    """
    n = len(dataset) if max_sentences is None else min(max_sentences, len(dataset))
    src_max, tgt_max = max_positions if isinstance(max_positions, tuple) else (max_positions, max_positions)
    keep, skipped = [], 0
    for i in range(n):
        src_len = int(dataset.src_sizes[i])
        tgt_len = int(dataset.tgt_sizes[i]) if dataset.tgt_sizes is not None else 0
        if (src_max is not None and src_len > src_max) or (tgt_max is not None and tgt_len > tgt_max):
            skipped += 1
        else:
            keep.append(i)
    keep.sort(key=lambda i: (int(dataset.src_sizes[i]), i))  # little padding
    return [keep[k:k + batch_size] for k in range(0, len(keep), batch_size)], len(keep), skipped


def run_split(model, dataset, *, batch_size: int = 64, max_sentences: Optional[int] = None,
              decoder: bool = True, components: bool = True, epsilon: float = EPSILON,
              progress: Optional[Callable[[int, int], None]] = None):
    """Column-sum statistics of ``model`` over ``dataset``.

    Returns (recorder, sentences analysed, sentences skipped as too long).
    """
    from fairseq import utils

    model.eval()
    device = next(model.parameters()).device
    index_batches, n_kept, n_skipped = batches(dataset, model.max_positions(), batch_size, max_sentences)
    if n_kept == 0:
        raise SplitError(
            f"no sentence to analyse: all {n_skipped} are longer than the model's "
            f"maximum positions {model.max_positions()}"
        )
    done = 0
    with ColumnSumRecorder(model, decoder=decoder, components=components, epsilon=epsilon) as rec, torch.no_grad():
        for idx in index_batches:
            sample = dataset.collater([dataset[i] for i in idx])
            sample = utils.move_to_cuda(sample, device=device) if device.type == "cuda" else sample
            net_input = sample["net_input"]
            if is_encoder_only(model):  # RoBERTa: the encoder's features, no LM or classification head
                model(net_input["src_tokens"], features_only=True)
            elif decoder:
                model(**net_input)  # teacher forcing: prev_output_tokens = shifted reference
            else:
                model.encoder(net_input["src_tokens"], src_lengths=net_input["src_lengths"])
            done += len(idx)
            if progress is not None:
                progress(done, n_kept)
    return rec, n_kept, n_skipped


def summary_rows(label: str, path: str, rec: ColumnSumRecorder) -> List[dict]:
    """One row per (attention module, component), in model order."""
    rows = []
    for site in rec.sites:
        comps = site_components(site)
        u = site.hybrid_weight
        for comp in comps:
            stats = rec.stats.get((site.kind, site.layer, comp))
            if stats is None:
                continue
            s = stats.summary()
            rows.append({
                "model": label,
                "checkpoint": path,
                "attention": site.kind,
                "layer": site.layer,
                "scheme": site.scheme,
                "component": comp,
                "hybrid_u_mean": "" if u is None else round(sum(u) / len(u), 4),
                "hybrid_u_per_head": "" if u is None else " ".join(f"{x:.4f}" for x in u),
                **{k: v for k, v in s.items() if not k.startswith("per_head")},
            })
    return rows
