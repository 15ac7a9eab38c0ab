"""Analysis tools behind ``fairseq_dnas.commands``: the paper's three pictures for your models.

- ``hybrid``: HNAS weights u (Eq. 12) read from checkpoints (Figures 3-5).
- ``checkpoints``: what loading a checkpoint for analysis needs (its task's
  data folder, its encoder's scheme); the loading, which registers the
  plugin, is ``fairseq_dnas.loading``, a layer above this library.
- ``capture``: per-head attention probabilities of every attention module,
  captured with forward hooks while the model runs unchanged.
- ``column_sums``: how much attention each key receives, sum_i pi_ij
  (Definition 1, Theorem 2, Figure 1).
- ``explaining_away``: run a model over a binarized split and collect those.
- ``mode_collapse``: Appendix E, Eq. (13)/(14) and the 1-D/2-D simulations.
- ``faithfulness``: is attention an explanation? Kendall's tau between the
  attention each token receives and its gradient importance (J. Kinley,
  2020, Chapter 6).
- ``attention_share``: attention's share of the residual stream per layer,
  ||attention output|| / ||layer input|| (reported beside tau).
- ``plots``: the matplotlib pictures (Agg backend, no display needed).
- ``files``: write outputs atomically (temporary file, then rename).

Nothing here is imported by ``import fairseq_dnas``, and nothing here
imports ``fairseq_dnas.plugin``; matplotlib is only imported by ``plots``.
"""
