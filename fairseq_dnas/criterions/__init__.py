"""fairseq criterions of this plugin: ``<base>_rf_penalty``, fairseq's
criterion ``<base>`` plus the receptive-field penalty
(``receptive_field_penalty``). fairseq's ``--user-dir`` imports only the
``tasks`` and ``models`` folders, so ``fairseq_dnas.tasks`` imports this."""

from fairseq_dnas.criterions import receptive_field_penalty  # noqa: F401  (registers the criterions)
