"""Internal steps of the recipes under examples/ (``python -m
fairseq_dnas.recipes.<name>``, started by examples/common.sh and the recipe
scripts): not a user interface, and free to change with the recipes.

- ``run_fairseq``: fairseq-train / fairseq-generate with the plugin and its
  one-line file errors (also under torchrun).
- ``progress``: the progress lines of long steps.
- ``collect_hypotheses``: fairseq-generate output -> one detokenized line per
  source line.
- ``sentencepiece_tool``: train a SentencePiece model, encode and truncate.
- ``gigaword_download``, ``gigaword_pairs``: the Gigaword data.
- ``parallel_text``: check and copy a pair of parallel-text files.
- ``masked_lm_data``: the masked-LM recipe's text.
- ``cpu_threads``: the default ``CPU_THREADS`` (the cores not already busy).
- ``install_check``: scripts/install.sh's last step (imports, versions, GPU).

``examples/check_python.py`` stays a file: it checks that the interpreter can
import this package at all.
"""
