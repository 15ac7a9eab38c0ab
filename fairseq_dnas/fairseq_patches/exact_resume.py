"""Patch ``exact_resume``: a run resumed inside epoch 2 or later sees the same batches as the run
left alone.

fairseq builds the training batches once, when ``fairseq-train`` starts:
``Trainer.get_train_iterator(epoch=1)`` loads the training set and
``FairseqTask.get_batch_iterator`` sorts it by length after a shuffle seeded
with ``seed + epoch`` (``numpy_seed(seed + epoch)`` around
``ordered_indices()`` in the installed fairseq), then caches that iterator and
reuses it for every later epoch (only the order of the batches changes from
epoch to epoch). A run resumed from a checkpoint of epoch ``k >= 2`` calls
``get_train_iterator(epoch=k)``: the set is loaded for epoch ``k`` and the
batches are built with ``seed + k``, so from the first update after the
restart on, every batch holds other sentences than in the uninterrupted run
(measured on a 2+1-layer model, 200 pairs, 30 updates: 4e-3 to 5e-3 largest
parameter difference; bitwise only when the restart was inside epoch 1).
Nothing in the checkpoint is missing; the iterator is rebuilt differently.

``install()`` makes that resume call do what the uninterrupted run did: load
the training set and build the iterator for epoch 1, then ask for epoch ``k``
the way ``fairseq_cli/train.py`` does at each new epoch (without reloading),
which returns the cached epoch-1 iterator (or, for a task that rebuilds its
batches every epoch, the batches of epoch ``k`` from the set loaded for epoch
1, as the uninterrupted run has them). Sharded data (``data1:data2:...``)
loads one shard per epoch in both runs and is left as it is.

A second difference comes from the order in ``fairseq_cli/train.py``: at the
end of epoch ``k`` it saves the checkpoint first and calls
``trainer.lr_step(k, valid_loss)`` after, so a checkpoint written at an
epoch's end holds the learning-rate scheduler as it was before that call.
``Trainer.load_checkpoint`` then calls ``lr_step(k + 1)`` without a loss, so
the resumed run never sees epoch ``k``'s validation loss: the scheduler's
``best`` differs (measured: 4.795 instead of 4.553 after stopping at the end of
epoch 2, parameters bitwise equal), and a scheduler that acts on validation
(``reduce_lr_on_plateau``) would shrink the rate at another time.
``install()`` makes that load call what the uninterrupted run called:
``lr_step(k, val_loss)``, with the loss fairseq itself stores in the
checkpoint (``extra_state["val_loss"]``). A checkpoint from inside an epoch
keeps fairseq's call.

A third: ``--patience``. ``fairseq_cli/train.py`` counts the validations
without a better score in attributes of its function ``should_stop_early``
(``best``, ``num_runs``), which no checkpoint holds, so a resumed run started
counting again from its first validation: it trained up to ``patience``
validations longer than the run left alone, and a first validation worse than
the best so far became the new reference. ``install()`` also wraps
``Trainer.save_checkpoint`` to store the count in the checkpoint's
``extra_state`` (key ``PATIENCE_KEY``), and this patch's layer of
``load_checkpoint`` sets it back, under fairseq's own rule for the best score
(``checkpoint_utils.save_checkpoint.best``: not with ``--reset-optimizer`` or
``--reset-meters``). A checkpoint without the key (written without this
patch) leaves fairseq's fresh count. A run that stopped early and is started
again still trains until its next validation before it stops: fairseq checks
patience only there.
"""

import logging
import os
import sys

logger = logging.getLogger(__name__)


def _resumes_past_first_epoch(trainer, epoch, load_dataset) -> bool:
    """Whether this ``get_train_iterator`` call is the restore of a run
    inside epoch 2 or later: in an uninterrupted run, fairseq loads the
    training set for epoch > 1 only when it is sharded."""
    return bool(load_dataset) and epoch > 1 and not trainer.task.has_sharded_data(trainer.cfg.dataset.train_subset)


def lr_step_of_uninterrupted_run(extra_state, epoch):
    """The ``(epoch, val_loss)`` that the uninterrupted run passed to
    ``Trainer.lr_step`` at the point where ``load_checkpoint`` calls
    ``lr_step(epoch)``. ``epoch`` is the checkpoint's iterator epoch: for a
    checkpoint saved at the end of epoch k, fairseq stores epoch k + 1 with
    0 iterations done (``EpochBatchIterator.state_dict``)."""
    itr_state = (extra_state or {}).get("train_iterator") or {}
    at_epoch_end = itr_state.get("version", 1) >= 2 and itr_state.get("iterations_in_epoch") == 0 and epoch > 1
    if not at_epoch_end:
        return epoch, None  # inside an epoch: fairseq's own call
    return epoch - 1, extra_state.get("val_loss")  # fairseq_cli/train.py: lr_step(epoch, valid_losses[0])


# extra_state key of the patience count (fairseq's own keys have no prefix)
PATIENCE_KEY = "fairseq_dnas_should_stop_early"


def _should_stop_early_functions() -> list:
    """fairseq_cli/train.py's ``should_stop_early`` where this process has
    it: in the module ``fairseq-train`` (and ``run_fairseq``) import, and in
    ``__main__`` under ``python -m fairseq_cli.train``."""
    found = []
    for name in ("fairseq_cli.train", "__main__"):
        function = getattr(sys.modules.get(name), "should_stop_early", None)
        code = getattr(function, "__code__", None)
        if code is not None and code.co_filename.endswith(os.path.join("fairseq_cli", "train.py")) \
                and function not in found:
            found.append(function)
    return found


def patience_state():
    """``{"best": ..., "num_runs": ...}``: fairseq's count of validations
    without a better score, or None before the first validation (or
    without ``--patience``, where fairseq keeps no count)."""
    for function in _should_stop_early_functions():
        if getattr(function, "best", None) is not None:
            return {"best": function.best, "num_runs": getattr(function, "num_runs", 0)}
    return None


def restore_patience_state(state) -> bool:
    """Set fairseq's patience count to ``state`` (``patience_state``'s
    form); False where this process has no ``should_stop_early``."""
    functions = _should_stop_early_functions()
    for function in functions:
        function.best, function.num_runs = state["best"], state["num_runs"]
    return bool(functions)


def install() -> None:
    """Wrap ``fairseq.trainer.Trainer.get_train_iterator``, ``lr_step`` and
    ``save_checkpoint``, and add this patch's layer to
    ``Trainer.load_checkpoint`` (idempotent)."""
    from fairseq import trainer as trainer_module

    from fairseq_dnas.fairseq_patches import is_patched, mark

    _install_lr_step_on_load(trainer_module.Trainer)
    _install_patience_on_save(trainer_module.Trainer)
    if is_patched(trainer_module.Trainer.get_train_iterator):
        return
    get_train_iterator = trainer_module.Trainer.get_train_iterator

    def get_train_iterator_as_uninterrupted(self, epoch, combine=True, load_dataset=True, data_selector=None,
                                            shard_batch_itr=True, disable_iterator_cache=False):
        if not _resumes_past_first_epoch(self, epoch, load_dataset):
            return get_train_iterator(self, epoch, combine, load_dataset, data_selector, shard_batch_itr,
                                      disable_iterator_cache)
        logger.info(f"resuming in epoch {epoch}: training set and batches built as in epoch 1, "
                    "like the run left alone (fairseq_dnas.fairseq_patches.exact_resume)")
        # What fairseq_cli/train.py does in a run left alone: the iterator of
        # epoch 1 (data loaded, batches built and cached) ...
        get_train_iterator(self, 1, combine, True, data_selector, shard_batch_itr, disable_iterator_cache)
        # ... then, at the start of epoch k, the same call without reloading.
        itr = get_train_iterator(self, epoch, combine, False, data_selector, shard_batch_itr,
                                 disable_iterator_cache)
        itr.epoch = epoch  # the cached iterator still says 1; the checkpoint's state sets the rest
        return itr

    get_train_iterator_as_uninterrupted.__wrapped__ = get_train_iterator
    get_train_iterator_as_uninterrupted.__doc__ = get_train_iterator.__doc__
    trainer_module.Trainer.get_train_iterator = mark(get_train_iterator_as_uninterrupted, "exact_resume")


def _install_lr_step_on_load(trainer_class) -> None:
    """``load_checkpoint`` calls ``self.lr_step(epoch)`` once, after loading
    the scheduler state and before the metrics; ``lr_step`` is wrapped to
    hold that call back, and this patch's layer of ``load_checkpoint`` makes,
    once the checkpoint's ``extra_state`` is known, the call of the
    uninterrupted run (``lr_step_of_uninterrupted_run``). Idempotent."""
    from fairseq_dnas.fairseq_patches import add_load_checkpoint_layer, is_patched, mark

    if not is_patched(trainer_class.lr_step):
        lr_step = trainer_class.lr_step

        def lr_step_held_during_load(self, epoch, val_loss=None):
            held = getattr(self, "_dnas_held_lr_steps", None)
            if held is None:
                return lr_step(self, epoch, val_loss)
            held.append((epoch, val_loss))
            return self.get_lr()

        lr_step_held_during_load.__wrapped__ = lr_step
        lr_step_held_during_load.__doc__ = lr_step.__doc__
        trainer_class.lr_step = mark(lr_step_held_during_load, "exact_resume")
    add_load_checkpoint_layer(trainer_class, "exact_resume", _load_checkpoint_as_uninterrupted)


def _install_patience_on_save(trainer_class) -> None:
    """``save_checkpoint(filename, extra_state)`` with the patience count
    added to ``extra_state`` (idempotent)."""
    from fairseq_dnas.fairseq_patches import is_patched, mark

    if is_patched(trainer_class.save_checkpoint):
        return
    save_checkpoint = trainer_class.save_checkpoint

    def save_checkpoint_with_patience(self, filename, extra_state):
        state = patience_state()
        if state is not None:
            extra_state = {**extra_state, PATIENCE_KEY: state}
        return save_checkpoint(self, filename, extra_state)

    save_checkpoint_with_patience.__wrapped__ = save_checkpoint
    save_checkpoint_with_patience.__doc__ = save_checkpoint.__doc__
    trainer_class.save_checkpoint = mark(save_checkpoint_with_patience, "exact_resume")


def _load_resets_training_state(args, kwargs) -> bool:
    """Whether ``load_checkpoint(filename, reset_optimizer, reset_lr_scheduler,
    optimizer_overrides, reset_meters)`` was called with --reset-optimizer or
    --reset-meters (fairseq's rule for restoring the best score)."""
    reset_optimizer = args[1] if len(args) > 1 else kwargs.get("reset_optimizer", False)
    reset_meters = args[4] if len(args) > 4 else kwargs.get("reset_meters", False)
    return bool(reset_optimizer or reset_meters)


def _load_checkpoint_as_uninterrupted(load, trainer, *args, **kwargs):
    """The layer of ``Trainer.load_checkpoint``: ``load`` with the scheduler
    steps it makes held back, then made as the uninterrupted run made them;
    fairseq's patience count set back to the checkpoint's."""
    trainer._dnas_held_lr_steps = []
    try:
        extra_state = load(*args, **kwargs)
    finally:
        held, trainer._dnas_held_lr_steps = trainer._dnas_held_lr_steps, None
    for epoch, val_loss in held:
        if val_loss is None:
            epoch, val_loss = lr_step_of_uninterrupted_run(extra_state, epoch)
            if val_loss is not None:
                logger.info(f"resuming at the end of epoch {epoch}: learning-rate scheduler stepped with "
                            f"its validation loss {val_loss:.4g}, like the run left alone "
                            "(fairseq_dnas.fairseq_patches.exact_resume)")
        trainer.lr_step(epoch, val_loss)  # no load in progress now: the wrapper passes it through
    state = (extra_state or {}).get(PATIENCE_KEY)
    if state is not None and not _load_resets_training_state(args, kwargs) and restore_patience_state(state):
        logger.info(f"patience: best validation score {state['best']:.6g}, {state['num_runs']} validation(s) "
                    "since without a better one, like the run left alone (fairseq_dnas.fairseq_patches.exact_resume)")
    return extra_state
