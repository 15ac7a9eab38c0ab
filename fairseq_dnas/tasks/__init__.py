"""fairseq tasks of this plugin (fairseq's --user-dir also imports every module here)."""

from fairseq_dnas.tasks import translation_rouge  # noqa: F401  (registers translation_rouge)

from fairseq_dnas import register_with_fairseq  # noqa: E402

register_with_fairseq()  # now complete: see fairseq_dnas._register_with_fairseq
