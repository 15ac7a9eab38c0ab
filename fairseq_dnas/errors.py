"""The plugin's own exceptions, importable without fairseq.

``BadFile`` is a checkpoint or data file that cannot be used (truncated,
corrupt, of another architecture); its ``str()`` is ``<path>: <what is
wrong>``. fairseq's readers raise it once the ``file_checks`` patch is
installed (``fairseq_dnas/fairseq_patches/file_checks.py``), and the analysis
scripts catch it.

``BadFlag`` is a command-line setting the plugin cannot run (an unknown
scheme, a temperature <= 0, an architecture without an input it needs). Its
``str()`` is one line that says what to change. It subclasses ``ValueError``,
so code that caught the plugin's earlier ``ValueError`` still catches it.
fairseq's commands print an uncaught ``BadFlag`` as ``error: <line>``, with
exit status 1 and no traceback (the ``one_line_errors`` patch of
``fairseq_dnas.fairseq_patches``).
"""


class BadFile(Exception):
    """A checkpoint or data file that cannot be used; str() is the one line."""

    def __init__(self, path, problem):
        super().__init__(f"{path}: {problem}")
        self.path = path


class BadFlag(ValueError):
    """A flag or flag combination that cannot run; str() is the one line."""
