"""``import fairseq_dnas.plugin`` does in Python what ``--user-dir fairseq_dnas``
does in a fairseq command: imports every module of ``fairseq_dnas/tasks`` and
``fairseq_dnas/models`` (which registers the tasks and models and installs
the patches of ``fairseq_dnas.fairseq_patches``; those marked
``command_line`` only inside a fairseq command).

Needed where ``fairseq_dnas`` is imported before fairseq reads
``--user-dir fairseq_dnas``: fairseq's ``import_user_module`` imports the
plugin's ``tasks`` and ``models`` only when the package is not in
``sys.modules`` yet, and otherwise only logs that it "has already been
imported" (fairseq 0.12.2 / ve-fairseq 0.12.3).
"""

import importlib
import pkgutil

from fairseq_dnas import models, tasks

# As fairseq's import_tasks / import_models: every module of the two folders,
# also one that the package's __init__ does not name.
for _package in (tasks, models):
    for _module in pkgutil.iter_modules(_package.__path__):
        if not _module.name.startswith("_"):
            importlib.import_module(f"{_package.__name__}.{_module.name}")
