#!/usr/bin/env python
"""Download the public Gigaword release of Rush et al. (2015) (harvardnlp
``sent-summary``, ``summary.tar.gz``, about 300 MB) and unpack it into
``DEST/sumdata`` in the layout examples/gigaword/prepare.sh reads.

The archive lives on Google Drive (linked from
https://github.com/harvardnlp/sent-summary). Google may answer with an HTML
page instead of the file (quota, changed link): then this script stops and
says how to fetch the file by hand (``pip install gdown; gdown --id ...``) and
pass the folder to prepare.sh, or to point ``--url`` at a mirror.
"""

import argparse
import gzip
import os
import shutil
import sys
import tarfile
import urllib.request

DRIVE_ID = "0B6N7tANPyVeBNmlSX19Ld2xDU1E"
URL = f"https://drive.usercontent.google.com/download?id={DRIVE_ID}&export=download&confirm=t"
NEEDED = [
    "train/train.article.txt", "train/train.title.txt",
    "train/valid.article.filter.txt", "train/valid.title.filter.txt",
    "Giga/input.txt", "Giga/task1_ref0.txt",
]


def fetch(url, dest):
    tmp = dest + ".part"
    with urllib.request.urlopen(url, timeout=60) as resp, open(tmp, "wb") as out:
        total = int(resp.headers.get("Content-Length") or 0)
        done, step = 0, 0
        while True:
            chunk = resp.read(1 << 20)
            if not chunk:
                break
            out.write(chunk)
            done += len(chunk)
            if done >> 25 > step:  # progress every 32 MiB
                step = done >> 25
                size = f" of {total >> 20} MiB" if total else ""
                print(f"[download] {done >> 20} MiB{size}", file=sys.stderr)
    with open(tmp, "rb") as f:
        is_gzip = f.read(2) == b"\x1f\x8b"
    if not is_gzip:
        os.remove(tmp)
        raise RuntimeError(
            f"{url} did not return a gzip archive (Google Drive may have answered "
            "with a web page). Fetch summary.tar.gz by hand, e.g. `pip install gdown; "
            f"gdown --id {DRIVE_ID}`, unpack it, and run prepare.sh with the sumdata "
            "folder as first argument (or pass --url with a mirror)."
        )
    os.replace(tmp, dest)


def safe_extract(archive, dest):
    root = os.path.realpath(dest)
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            target = os.path.realpath(os.path.join(dest, member.name))
            if not target.startswith(root + os.sep) or member.issym() or member.islnk():
                raise RuntimeError(f"refusing unsafe archive member {member.name!r}")
        tar.extractall(dest)


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
    p.add_argument("--url", default=URL, help="where summary.tar.gz is fetched from")
    args = p.parse_args(argv)

    sumdata = os.path.join(args.dest, "sumdata")
    if all(os.path.exists(os.path.join(sumdata, n)) for n in NEEDED):
        print(f"[download] {sumdata} is there already", file=sys.stderr)
        return 0
    os.makedirs(args.dest, exist_ok=True)
    archive = os.path.join(args.dest, "summary.tar.gz")
    try:
        if not os.path.exists(archive):
            print(f"[download] fetching the public Gigaword release from {args.url}",
                  file=sys.stderr)
            fetch(args.url, archive)
        safe_extract(archive, args.dest)
        gunzip_training_files(sumdata)
    except Exception as err:  # network, archive or disk trouble: say what to do
        print(f"error: {err}", file=sys.stderr)
        return 1
    missing = [n for n in NEEDED if not os.path.exists(os.path.join(sumdata, n))]
    if missing:
        print(f"error: the archive did not contain {', '.join(missing)} under {sumdata}",
              file=sys.stderr)
        return 1
    print(f"[download] ready: {sumdata}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
