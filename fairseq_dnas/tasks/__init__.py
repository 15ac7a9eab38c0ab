"""fairseq tasks of this plugin: importing this registers them, and the
plugin's criterions (``fairseq_dnas.criterions``), and installs the patches
of ``fairseq_dnas.fairseq_patches`` (fairseq's ``--user-dir`` imports this
package first, then every module here)."""

from fairseq_dnas import criterions  # noqa: F401  (registers the <base>_rf_penalty criterions)
from fairseq_dnas import fairseq_patches
from fairseq_dnas.tasks import translation_rouge  # noqa: F401  (registers translation_rouge)

fairseq_patches.install()
