"""The plugin's own exceptions, importable without fairseq.

``BadFlag`` is a command-line setting the plugin cannot run (an unknown
scheme, a temperature <= 0, an architecture without an input it needs). Its
``str()`` is one line that says what to change. It subclasses ``ValueError``,
so code that caught the plugin's earlier ``ValueError`` still catches it.
fairseq's commands print an uncaught ``BadFlag`` as ``error: <line>``, with
exit status 1 and no traceback (the command-line hook lives with the other
changes to fairseq's behaviour).
"""


class BadFlag(ValueError):
    """A flag or flag combination that cannot run; str() is the one line."""
