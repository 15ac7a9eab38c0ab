"""``import fairseq_dnas.plugin`` does in Python what ``--user-dir fairseq_dnas``
does in a fairseq command: registers the models and tasks and installs the
patches of ``fairseq_dnas.fairseq_patches`` (those marked ``command_line``
only inside a fairseq command).

Needed where ``fairseq_dnas`` is imported before fairseq reads
``--user-dir fairseq_dnas``: fairseq's ``import_user_module`` imports the
plugin's ``tasks`` and ``models`` only when the package is not in
``sys.modules`` yet, and otherwise only logs that it "has already been
imported" (fairseq 0.12.2 / ve-fairseq 0.12.3).
"""

from fairseq_dnas import models, tasks  # noqa: F401  (each registers, and installs the patches)
