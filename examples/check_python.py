#!/usr/bin/env python
"""Does this interpreter have what the recipes need? (``check_python`` in
examples/common.sh runs this with the recipe's ``$PYTHON``.)

Exit status 0 if fairseq, fairseq_dnas, sentencepiece and rouge_score import;
1 otherwise, with one line on stdout naming the first module that is missing
or fails to import (fairseq 0.12.2 on Python >= 3.11 fails that way).

Importing fairseq costs about 7 CPU seconds (torch, and scikit-learn through
two of fairseq's own modules), and every recipe script checks before its
first step, so a check that passed is remembered: an empty stamp file whose
name is a hash of the interpreter and of where each module lives and when its
files last changed. Installing, upgrading or removing any of the four changes
the key, so the next run imports them again; a module that cannot even be
found fails at once, stamp or not. The stamps live in
``${XDG_CACHE_HOME:-~/.cache}/fairseq-dnas/checked/``;
``FAIRSEQ_DNAS_CHECK_CACHE=0`` imports every time. Only the standard library
is used before the imports, so the remembered case takes a Python start-up
(about 0.05 s).
"""

import hashlib
import importlib
import importlib.util
import os
import sys

MODULES = ("fairseq", "fairseq_dnas", "sentencepiece", "rouge_score")


def _stat(path):
    try:
        st = os.stat(path)
    except OSError:
        return "-"
    return f"{st.st_mtime_ns}:{st.st_size}"


def key(specs) -> str:
    """A hash of the interpreter and, per module, its file and folder with
    their modification times and sizes: what a reinstall changes."""
    parts = [os.path.realpath(sys.executable), _stat(os.path.realpath(sys.executable)), sys.version]
    for name, spec in specs.items():
        origin = spec.origin or ""
        folders = list(spec.submodule_search_locations or [])
        parts += [name, origin, _stat(origin), *(f"{d}={_stat(d)}" for d in folders)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def stamp_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fairseq-dnas", "checked")


def main() -> int:
    specs = {}
    for name in MODULES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError) as e:
            spec, why = None, str(e)
        else:
            why = "not installed"
        if spec is None:
            print(f"{name}: {why}")
            return 1
        specs[name] = spec
    use_cache = os.environ.get("FAIRSEQ_DNAS_CHECK_CACHE", "1") != "0"
    stamp = os.path.join(stamp_dir(), key(specs))
    if use_cache and os.path.exists(stamp):
        return 0
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 (any failure to import is the answer)
            print(f"{name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": "))
            return 1
    if use_cache:
        try:  # remembering is an optimization: a read-only home just imports next time too
            os.makedirs(os.path.dirname(stamp), exist_ok=True)
            open(stamp, "w").close()
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
