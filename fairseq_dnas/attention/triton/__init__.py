"""The Triton kernels (CUDA; CPU tensors under Triton's interpreter for tests).

``flash.py``: any length, any number of Sinkhorn rounds; ``short.py``: one
tile a head for T_q, T_k <= ``selection.SHORT_MAX``; ``sinkhorn.py``: the
extra normalization rounds of ``flash.py``; ``common.py``: what they share
(tiles, offsets, the dropout mask, the column log-sum-exp pass). Each kernel
set has ``triton_attention`` with the same arguments and result;
``attention/selection.py`` picks one.
"""
