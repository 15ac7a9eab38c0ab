"""fairseq tasks of this plugin (fairseq's --user-dir also imports every module here)."""

from fairseq_dnas.tasks import translation_rouge  # noqa: F401  (registers translation_rouge)
