#!/usr/bin/env python
"""Download the public Gigaword release of Rush et al. (2015) (harvardnlp
``sent-summary``, ``summary.tar.gz``, about 300 MB) and unpack it into
``DEST/sumdata`` in the layout examples/gigaword/prepare.sh reads.

    python -m fairseq_dnas.recipes.gigaword_download DEST [--url URL]

The archive lives on Google Drive (linked from the harvardnlp/sent-summary
repository on GitHub). It is fetched with ``gdown``, which follows Drive's
confirmation and virus-scan pages; ``--url`` (prepare.sh: ``DOWNLOAD_URL``)
takes any other http(s) address of the same archive, e.g. a mirror on your
own network. What arrives must be a gzip archive holding the sumdata files,
else nothing is unpacked. An interrupted download resumes from its partial
file when run again.

Without internet, or when the download fails: fetch ``summary.tar.gz`` on
another machine, unpack it, and give the recipes its ``sumdata`` folder
(``GIGAWORD_DIR=/path/to/sumdata`` for quickstart.sh, the folder instead of
``download`` for prepare.sh).
"""

import argparse
import gzip
import os
import shutil
import sys
import tarfile

DRIVE_ID = "0B6N7tANPyVeBNmlSX19Ld2xDU1E"
URL = f"https://drive.google.com/uc?id={DRIVE_ID}"
NEEDED = [
    "train/train.article.txt", "train/train.title.txt",
    "train/valid.article.filter.txt", "train/valid.title.filter.txt",
    "Giga/input.txt", "Giga/task1_ref0.txt",
]
# What to do when the download fails, on the same line as the reason.
MANUAL = ("without internet, fetch summary.tar.gz (harvardnlp/sent-summary) elsewhere, unpack it, and set "
          "GIGAWORD_DIR to its sumdata folder (prepare.sh: give that folder instead of 'download')")


class DownloadFailed(Exception):
    """The archive could not be fetched or is not the archive; the message is the reason."""


def _reason(err):
    """A short reason for a failed request (requests' own messages run to several lines)."""
    import requests
    from gdown.exceptions import FileURLRetrievalError

    while not isinstance(err, (requests.exceptions.RequestException, FileURLRetrievalError)) and (
            err.__cause__ or err.__context__):  # gdown's "failed after N retries" wraps the last error
        err = err.__cause__ or err.__context__
    if isinstance(err, FileURLRetrievalError):
        return "Google Drive answered with a web page, not the file (download quota or a changed link)"
    if isinstance(err, requests.exceptions.HTTPError) and err.response is not None:
        return f"the server answered HTTP {err.response.status_code}"
    if isinstance(err, requests.exceptions.Timeout):
        return "the server did not answer in time"
    if isinstance(err, requests.exceptions.ConnectionError):
        return "no connection to the server (offline, or the name does not resolve)"
    return " ".join(str(err).split())[:200]


def fetch(url, dest):
    """Download url to dest with gdown; raise DownloadFailed unless a gzip file arrived."""
    try:
        import gdown
        import requests
        from gdown.exceptions import DownloadError
    except ImportError as err:
        raise DownloadFailed(f"{err.name} is not installed (bash scripts/install.sh installs it)") from err

    try:
        gdown.download(url=url, output=dest, quiet=False, resume=True, use_cookies=False, timeout=60, retries=2)
    except (requests.exceptions.RequestException, DownloadError) as err:
        raise DownloadFailed(_reason(err)) from err
    with open(dest, "rb") as f:
        head = f.read(64)
    if head[:2] != b"\x1f\x8b":
        os.remove(dest)
        start = head[:20].decode("ascii", "replace").split("\n")[0]
        raise DownloadFailed(f"what arrived is not a gzip archive (it starts with {start!r})")


def safe_extract(archive, dest):
    root = os.path.realpath(dest)
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar.getmembers():
                target = os.path.realpath(os.path.join(dest, member.name))
                if not target.startswith(root + os.sep) or member.issym() or member.islnk():
                    raise DownloadFailed(f"refusing unsafe archive member {member.name!r}")
            tar.extractall(dest)
    except (tarfile.TarError, EOFError, OSError) as err:
        raise DownloadFailed(f"{archive} is not a complete tar.gz archive ({err}); delete it to download again") \
            from err


def gunzip_training_files(sumdata):
    for name in ("train/train.article.txt", "train/train.title.txt"):
        path = os.path.join(sumdata, name)
        if not os.path.exists(path) and os.path.exists(path + ".gz"):
            with gzip.open(path + ".gz", "rb") as fin, open(path + ".tmp", "wb") as fout:
                shutil.copyfileobj(fin, fout)
            os.replace(path + ".tmp", path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dest", help="folder to unpack into (gets DEST/sumdata)")
    p.add_argument("--url", default=URL, help="where summary.tar.gz is fetched from (default: the Google Drive file)")
    args = p.parse_args(argv)

    sumdata = os.path.join(args.dest, "sumdata")
    if all(os.path.exists(os.path.join(sumdata, n)) for n in NEEDED):
        print(f"[download] {sumdata} is there already", file=sys.stderr)
        return 0
    os.makedirs(args.dest, exist_ok=True)
    archive = os.path.join(args.dest, "summary.tar.gz")
    try:
        if not os.path.exists(archive):
            print(f"[download] fetching the public Gigaword release (about 300 MB) from {args.url}",
                  file=sys.stderr)
            fetch(args.url, archive)
        safe_extract(archive, args.dest)
        gunzip_training_files(sumdata)
        missing = [n for n in NEEDED if not os.path.exists(os.path.join(sumdata, n))]
        if missing:
            raise DownloadFailed(f"the archive did not contain {', '.join(missing)} under sumdata/")
    except DownloadFailed as err:
        print(f"error: downloading Gigaword from {args.url} failed: {err}; {MANUAL}", file=sys.stderr)
        return 1
    except OSError as err:  # disk full, permissions
        print(f"error: cannot write the Gigaword files under {args.dest}: {err}", file=sys.stderr)
        return 1
    print(f"[download] ready: {sumdata}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
