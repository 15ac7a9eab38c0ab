"""The commands a user runs, each ``python -m fairseq_dnas.commands.<name>``
(from any directory, ``--help`` on each), or its console script
``fairseq-dnas-<name>`` (setup.py; ``_`` becomes ``-``):

Scoring and tables
- ``rouge_eval``: ROUGE-1/2/L/Lsum F1 of a hypothesis file against references.
- ``bleu_eval``: sacreBLEU BLEU and chrF of a hypothesis file.
- ``lead_baseline``: the Lead-N summarization baseline.
- ``seed_table``: the paper's Table 3 form, mean ± standard error over
  seeds, from ``rouge_eval`` results.
- ``bleu_table``: the same for ``bleu_eval`` results.
- ``sentence_classify``: score or use a fine-tuned sentence classifier.

Analysis (the paper's pictures and Kinley's faithfulness metric)
- ``explaining_away``: sum_i pi_ij histograms (Figure 1).
- ``plot_hybrid_weights``: HNAS weights u per layer (Figures 3-5).
- ``mode_collapse``: Appendix E's simulations (Figures 6-9).
- ``faithfulness``: Kendall's tau between attention and gradient
  importance, sentence classifiers.
- ``translation_faithfulness``: the same for translation models.
- ``hf_faithfulness``: the same for Hugging Face transformers classifiers.

Steps the recipes under examples/ run for themselves are in
``fairseq_dnas.recipes``.
"""

# name -> what it does: the console scripts of setup.py and tests/test_layout.py
COMMANDS = {
    "rouge_eval": "ROUGE-1/2/L/Lsum F1 of a hypothesis file",
    "bleu_eval": "sacreBLEU BLEU and chrF of a hypothesis file",
    "lead_baseline": "the Lead-N summarization baseline",
    "seed_table": "ROUGE table, mean ± standard error over seeds",
    "bleu_table": "BLEU/chrF table, mean ± standard error over seeds",
    "sentence_classify": "score or use a fine-tuned sentence classifier",
    "explaining_away": "explaining-away histograms (Figure 1)",
    "plot_hybrid_weights": "HNAS weights u per layer (Figures 3-5)",
    "mode_collapse": "mode-collapse simulations (Appendix E)",
    "faithfulness": "attention faithfulness, sentence classifiers",
    "translation_faithfulness": "attention faithfulness, translation",
    "hf_faithfulness": "attention faithfulness, transformers classifiers",
}
