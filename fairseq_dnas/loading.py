"""Load fairseq checkpoints for the analysis commands.

The one module that joins the fairseq side to the analysis library. Loading
a checkpoint of this plugin's models needs the plugin registered (its models
and tasks, and fairseq's checkpoint loading under torch >= 2.6); the analysis
library (``fairseq_dnas.analysis``) works on loaded models and checkpoint
states and imports no plugin. Imports go down:

    fairseq_dnas.commands  ->  fairseq_dnas.loading  ->  fairseq_dnas.plugin
                                                     ->  fairseq_dnas.analysis
"""

import os

import torch

from fairseq_dnas.analysis.checkpoints import DataMismatch, _override, checkpoint_task, plugin_dir, task_data
from fairseq_dnas.analysis.hybrid import HybridWeights, hybrid_weights

__all__ = ["DataMismatch", "load_model", "read_hybrid_weights", "read_state"]


def _register_plugin() -> None:
    import fairseq_dnas.plugin  # noqa: F401  (models, tasks, fairseq checkpoint loading under torch >= 2.6)
    from fairseq_dnas import fairseq_patches

    fairseq_patches.install(only=["file_checks"])  # a bad checkpoint or data file: BadFile naming it


def read_state(path: str):
    """The saved state of checkpoint ``path`` (fairseq's
    ``load_checkpoint_to_cpu``). FileNotFoundError for a missing file,
    ``errors.BadFile`` (one line naming the file) for a truncated or corrupt
    one."""
    _register_plugin()
    from fairseq import checkpoint_utils

    from fairseq_dnas.fairseq_patches.file_checks import read_checkpoint

    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint not found: {path}")
    return read_checkpoint(checkpoint_utils.load_checkpoint_to_cpu, path)


def read_hybrid_weights(path: str) -> HybridWeights:
    """u per encoder layer and head of the HNAS checkpoint ``path``
    (``analysis.hybrid.hybrid_weights`` of its state): FileNotFoundError,
    ``errors.BadFile``, or ``analysis.hybrid.NoHybridWeights`` for a
    checkpoint without HNAS weights."""
    return hybrid_weights(read_state(path), path)


def load_model(path: str, data: str, device: str = "cpu"):
    """(model in eval mode, cfg, task) of checkpoint ``path``, with the task's
    data folder set to ``data`` (the dictionaries are read from there; for a
    masked_lm checkpoint given a sentence_prediction folder, ``data/input0``).

    FileNotFoundError for a missing file or folder; ``errors.BadFile``
    (one line naming the file) for a truncated or corrupt checkpoint, one
    that does not fit the data's dictionary, or a bad data file;
    DataMismatch for a data folder of another kind than the checkpoint's
    task reads (translation data for a RoBERTa checkpoint, or the reverse)."""
    _register_plugin()
    from fairseq import checkpoint_utils

    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if not os.path.isdir(data):
        raise FileNotFoundError(f"data folder not found: {data} (give the fairseq-preprocess --destdir)")
    # Read once, look at the task, then build from the same state.
    state = checkpoint_utils.load_checkpoint_to_cpu(path, {"user_dir": plugin_dir()})
    overrides = {"data": task_data(checkpoint_task(state), data, path), "user_dir": plugin_dir()}
    _override(state, overrides)
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides=overrides, state=state)
    model = models[0].eval().to(torch.device(device))
    return model, cfg, task
