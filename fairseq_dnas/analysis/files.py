"""Write outputs so that a crash never leaves a half-written file behind."""

import csv
import json
import os
import tempfile
from contextlib import contextmanager


@contextmanager
def atomic_path(path):
    """Yield a temporary path beside ``path``; rename it to ``path`` on success.

    The suffix is kept so that tools that pick a format from the file name
    (matplotlib's ``savefig``) still do the right thing.
    """
    path = os.path.abspath(path)
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    suffix = os.path.splitext(path)[1]
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=suffix, dir=folder)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; use the usual mode
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_csv(path, rows, fieldnames):
    """rows: iterable of dicts with the keys ``fieldnames``."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fieldnames)
            writer.writeheader()
            for row in rows:
                writer.writerow(row)


def write_text(path, text):
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)


def write_json(path, obj):
    write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def save_figure(fig, path, dpi=100):
    """Save a matplotlib figure atomically and close it."""
    import matplotlib.pyplot as plt

    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=dpi, bbox_inches="tight")
    finally:
        plt.close(fig)
