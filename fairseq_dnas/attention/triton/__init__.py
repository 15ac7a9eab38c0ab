"""The Triton kernels (CUDA; CPU tensors under Triton's interpreter for tests).

Two kernel sets, each a ``triton_attention`` with the same arguments and
result (``attention/selection.py`` picks one, ``attention/dispatch.py``
calls it): ``long.py``, any length and any number of Sinkhorn rounds
(``sinkhorn.py``: the extra normalization rounds); ``short.py``, one tile a
head for T_q, T_k <= ``selection.SHORT_MAX``. What they share, one idea a
file: ``tiles.py`` (which tile each kernel runs), ``launch.py`` (grid,
offsets, tile loads and stores), ``dropout.py`` (the Philox mask),
``column.py`` (the column log-sum-exp pass), ``call.py`` (a call's masks,
seed and output buffer).
"""
