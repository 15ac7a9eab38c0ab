"""Run a model over a binarized split and collect sum_i pi_ij for every
attention module (Definition 1, Theorem 2, Figure 1 of the paper).

The model runs as in training, with teacher forcing (the reference target is
the decoder input), in eval mode (no dropout). Three kinds of attention:

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

from fairseq_dnas.analysis.capture import Site, attention_sites, call_kwargs, check_same_output, head_probs
from fairseq_dnas.analysis.column_sums import EPSILON, ColumnStats, column_sums

# An HNAS module is reported as the mixture the model uses and, apart, as its
# two components.
COMPONENTS = ("mixture", "dnas", "unas")


class SplitError(ValueError):
    """A data split that cannot be analysed (missing, empty)."""


class ColumnSumRecorder:
    """While active (``with``), every forward of ``model`` adds sum_i pi_ij of
    each attention module to ``self.stats[(kind, layer, component)]``."""

    def __init__(self, model, decoder: bool = True, components: bool = True, epsilon: float = EPSILON):
        self.model = model
        self.sites = attention_sites(model, decoder=decoder)
        self.components = components
        self.epsilon = epsilon
        self.stats: Dict[Tuple[str, int, str], ColumnStats] = {}
        self._pad = {}
        self._handles = []

    def __enter__(self):
        enc, dec = self.model.encoder, getattr(self.model, "decoder", None)
        # Padding masks of the whole batch, from the token ids themselves.
        self._handles.append(enc.register_forward_pre_hook(self._pad_hook("src", enc.padding_idx), with_kwargs=True))
        if dec is not None:
            self._handles.append(dec.register_forward_pre_hook(self._pad_hook("tgt", dec.padding_idx), with_kwargs=True))
        for site in self.sites:
            self._handles.append(site.module.register_forward_hook(self._site_hook(site), with_kwargs=True))
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = []
        return False

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

    def _add(self, site, component, probs, query_pad, key_pad):
        heads, batch, t_q, t_k = probs.shape
        for mask, t in ((query_pad, t_q), (key_pad, t_k)):
            if mask is not None and tuple(mask.shape) != (batch, t):
                raise RuntimeError(f"padding mask {tuple(mask.shape)} does not fit attention {tuple(probs.shape)}")
        key = (site.kind, site.layer, component)
        if key not in self.stats:
            self.stats[key] = ColumnStats(heads, self.epsilon)
        self.stats[key].add(*column_sums(probs, query_pad, key_pad))


def load_split(task, subset: str, data: str):
    """Load ``subset`` of the binarized folder ``data``; SplitError if it is
    missing or empty."""
    files = os.listdir(data) if os.path.isdir(data) else []
    bins = [f for f in files if f.startswith(subset + ".") and f.endswith(".bin")]
    empty = SplitError(f"split '{subset}' in {data} is empty (0 sentences); choose another with --subset")
    # fairseq cannot even open an empty binarized split (mmap of 0 bytes).
    if bins and all(os.path.getsize(os.path.join(data, f)) == 0 for f in bins):
        raise empty
    try:
        task.load_dataset(subset, combine=False, epoch=1)
    except FileNotFoundError:
        found = sorted({f.split(".")[0] for f in files if f.endswith(".idx")})
        raise SplitError(
            f"split '{subset}' not found in {data} (fairseq-preprocess writes "
            f"{subset}.<src>-<tgt>.<lang>.bin/.idx there); splits found: "
            f"{', '.join(found) or 'none'}. Choose one with --subset."
        ) from None
    dataset = task.dataset(subset)
    if len(dataset) == 0:
        raise empty
    return dataset


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
            if decoder:
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
        comps = COMPONENTS if site.scheme == "hnas" else (site.scheme,)
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
