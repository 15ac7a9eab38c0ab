#!/usr/bin/env python
"""Show how far a long recipe step is, by following the file it writes.

    python -m fairseq_dnas.recipes.progress train SAVE_DIR/train.log --total 1500
    python -m fairseq_dnas.recipes.progress lines OUT.generate.log.tmp --total 500 --prefix H- --label generate --unit sentences
    python -m fairseq_dnas.recipes.progress lines OUT.tmp --total 3800000 --label prepare --unit lines
    python -m fairseq_dnas.recipes.progress bytes 'OUT/bin.tmp/*.bin' --total 270000000 --label prepare --unit binarized

``train`` reads fairseq-train's log (``--log-format simple`` or ``json``, in
either logging layout: ``2026-11-23 10:00:00 | INFO | train_inner | epoch
001: ...``, or ``INFO:train_inner:epoch 001: ...`` when something configured
Python's logging before fairseq did) and prints

    [train] update 300/1500 (20%) loss 5.21 elapsed 2m10s left 8m40s

plus one line per validation (``[train] validation at update 1500: loss 4.58
rouge1 20.1``). ``lines`` counts the complete lines of a growing file (those
starting with --prefix, if given) against --total: decoding (fairseq-generate
writes one ``H-`` line per sentence) and line-by-line preprocessing.
``bytes`` adds up the sizes of the files a glob pattern matches against
--total bytes: fairseq-preprocess, which logs nothing until a whole split is
done, writes its ``.bin`` files a token at a time (``[prepare] binarized
120.5/480.2 MB (25%) ...``). Its worker processes write temporary files that
are merged at the end, so the count may reach 100% a little before the job
ends; it never goes past 100%.

On a terminal (stderr is a tty) the line is refreshed in place (carriage
return); otherwise (CI logs, a file) a plain line is printed every --step
percent, so a log of a long run stays short. The full log is never changed:
this only reads it.

It runs beside the job it watches (examples/common.sh starts and stops it)
and stops, after a last read, on SIGTERM or when the process --watch names is
gone, so it can never outlive the script that started it. Whatever goes wrong
here, the job's own exit status is the caller's: the shell ignores ours.
"""

import argparse
import glob
import json
import os
import re
import signal
import sys
import time

POLL_SECONDS = 0.5

# fairseq's progress lines, in both layouts that its logging produces.
TRAIN_INNER = re.compile(r"\btrain_inner\b.*?\bnum_updates=(\d+)")
INNER_LOSS = re.compile(r"\bloss=([-+0-9.eE]+|nan|inf)")
VALID = re.compile(r"\bvalid on '([^']+)' subset\s*\|(.*)")
BEGIN_VALID = re.compile(r"begin validation on ")
# --log-format json: "| train_inner | {...}" or "INFO:valid:{...}".
JSON_STATS = re.compile(r"(?:\| |INFO:)(train_inner|valid)[ |:]+(\{.*\})\s*$")
# Validation fields worth a glance; the rest stays in the log.
VALID_KEYS = ("loss", "ppl", "bleu", "rouge1", "rouge2", "rougeL", "accuracy", "mcc")


def duration(seconds):
    """1h02m, 3m05s, 42s: short enough for one console line."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


class Progress:
    """Turns the lines of a followed file into console lines. Pure: the
    caller passes the time, so a test replays a log with the clock it wants.

    The rate behind "left" is measured from the first progress line to the
    latest one, so the start-up (loading data, building the model) and the
    updates of a resumed run done before do not count as work: no estimate
    until progress was seen at two moments.
    """

    def __init__(self, kind, total, label, unit="lines", prefix="", now=0.0):
        self.kind, self.total, self.label, self.unit, self.prefix = kind, total, label, unit, prefix
        self.done = 0
        self.start_time = now
        self.first = None  # (time, done) of the first progress line
        self.interval = None  # the smallest step between two counts (fairseq's --log-interval)
        self.last_time = now  # when the latest count was seen
        self.loss = None
        self.validating = False

    def feed(self, line, now):
        """Read one complete line. Returns a line to print for good (a
        validation result), else None."""
        if self.kind == "lines":
            if line.startswith(self.prefix):
                self._count(self.done + 1, now)
            return None
        m = JSON_STATS.search(line)
        if m:
            try:
                stats = json.loads(m.group(2))
            except ValueError:
                return None
            if m.group(1) == "train_inner":
                line = "train_inner " + ", ".join(f"{k}={v}" for k, v in stats.items())
            else:
                subset = "valid"  # fairseq's json names the fields valid_<name>
                fields = " | ".join(f"{k[len(subset) + 1:]} {v}" for k, v in stats.items()
                                    if k.startswith(subset + "_"))
                line = f"valid on '{subset}' subset | {fields}"
        m = TRAIN_INNER.search(line)
        if m:
            loss = INNER_LOSS.search(line)
            if loss:
                self.loss = loss.group(1)
            self.validating = False
            self._count(int(m.group(1)), now)
            return None
        if BEGIN_VALID.search(line):
            self.validating = True
            return None
        m = VALID.search(line)
        if m:
            self.validating = False
            fields = {}
            for part in m.group(2).split("|"):
                words = part.split()
                if len(words) == 2:
                    fields[words[0]] = words[1]
            if fields.get("num_updates", "").isdigit():
                self._count(int(fields["num_updates"]), now)
            shown = " ".join(f"{k} {fields[k]}" for k in VALID_KEYS if k in fields)
            subset = "" if m.group(1) == "valid" else f" ({m.group(1)})"
            return f"[{self.label}] validation{subset} at update {fields.get('num_updates', '?')}: {shown}"
        return None

    def _count(self, done, now):
        if self.first is None:
            self.first = (now, done)  # (a resumed run starts past 0: no interval from 0 to here)
        elif done > self.done:
            step = done - self.done
            self.interval = step if self.interval is None else min(self.interval, step)
        self.done, self.last_time = done, now

    def step_size(self, step_percent):
        """The counts between two plain console lines: STEP percent of the
        total, rounded down to a whole number of the intervals the counts
        come in (at least one). Otherwise a 5% step (75 of 1,500 updates)
        against a log line every 50 updates swallows one line in three."""
        interval = self.interval or 1
        size = self.total * step_percent / 100
        return max(interval, int(size // interval) * interval)

    def percent(self):
        return min(100.0, 100.0 * self.done / self.total) if self.total > 0 else 0.0

    def left(self, now):
        """Seconds left at the rate seen from the first to the latest count
        (counting down between counts), or None while unknown."""
        if self.total <= 0 or self.first is None:
            return None
        t0, d0 = self.first
        if self.done <= d0 or self.last_time <= t0:
            return None
        finish = self.last_time + max(0, self.total - self.done) * (self.last_time - t0) / (self.done - d0)
        return max(0.0, finish - now)

    def render(self, now):
        if self.kind == "train":
            text = f"[{self.label}] update {self.done}/{self.total} ({self.percent():.0f}%)"
            if self.loss is not None:
                text += f" loss {self.loss}"
        elif self.kind == "bytes":
            text = (f"[{self.label}] {self.unit} {min(self.done, self.total) / 1e6:.1f}/{self.total / 1e6:.1f} MB "
                    f"({self.percent():.0f}%)")
        else:
            text = f"[{self.label}] {self.done}/{self.total} {self.unit} ({self.percent():.0f}%)"
        text += f" elapsed {duration(now - self.start_time)}"
        left = self.left(now)
        if left is not None and self.done < self.total:
            text += f" left {duration(left)}"
        if self.validating:
            text += " (validating)"
        return text


class Console:
    """Where the lines go: one line refreshed in place on a terminal, else
    a plain line each time another STEP percent is done (and the first and
    last), so that a CI log gets about 100 / STEP lines per step. STEP is
    rounded down to whole log intervals (``Progress.step_size``): every
    progress line fairseq logs is shown when they are further apart than
    STEP percent, and every k-th one, evenly, when they are closer."""

    def __init__(self, stream, step, tty=None):
        self.stream, self.step = stream, step
        self.tty = stream.isatty() if tty is None else tty
        self.shown_bucket = None
        self.open_line = False  # a refreshed line without its newline yet

    def _write(self, text):
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # the console is gone: nothing to show it on
            pass

    def message(self, text):
        """A line kept for good (validation results)."""
        self._write(("\r\x1b[K" if self.open_line else "") + text + "\n")
        self.open_line = False

    def update(self, progress, now, last=False):
        if progress.first is None:
            return  # nothing counted (yet): no line of zeros
        text = progress.render(now)
        if self.tty:
            self._write("\r\x1b[K" + text + ("\n" if last else ""))
            self.open_line = not last
            return
        done = min(progress.done, progress.total) if progress.total > 0 else progress.done
        bucket = done // progress.step_size(self.step) if self.step > 0 else progress.done
        if bucket != self.shown_bucket:  # the last line too: a repeat of it is not shown
            self._write(text + "\n")
            self.shown_bucket = bucket


class Follower:
    """Reads the complete lines added to a file since the last call (the
    file may not exist yet, or be replaced by a shorter one)."""

    def __init__(self, path, offset=0):
        self.path, self.offset, self.partial = path, offset, b""

    def lines(self):
        try:
            size = os.path.getsize(self.path)
        except OSError:
            return []
        if size < self.offset:  # truncated or replaced: start again
            self.offset, self.partial = 0, b""
        if size == self.offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(size - self.offset)
        self.offset += len(data)
        data = self.partial + data
        *complete, self.partial = data.split(b"\n")
        return [line.decode("utf-8", "replace") for line in complete]


class Sizes:
    """The bytes written so far to the files a glob pattern matches (none
    yet: 0). Stands in for Follower in the ``bytes`` kind."""

    def __init__(self, pattern):
        self.pattern = pattern

    def total(self):
        size = 0
        for path in glob.glob(self.pattern):
            try:
                size += os.path.getsize(path)
            except OSError:  # removed between glob and stat (a merged worker file)
                pass
        return size


def alive(parent):
    """Whether the process that started us (--watch) still runs: when it
    ends, even killed and not yet reaped, we are handed to another parent."""
    return not parent or os.getppid() == parent


def follow(args, stream=sys.stderr, clock=time.monotonic):
    """Follow until SIGTERM, until --watch's process is gone, or (--once)
    until the end of the file; then one last read and a last line."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    signal.signal(signal.SIGINT, lambda *_: stop.append(True))
    start = clock()
    progress = Progress(args.kind, args.total, args.label, unit=args.unit, prefix=args.prefix, now=start)
    console = Console(stream, args.step, tty=None)
    follower = Follower(args.file, args.from_byte) if args.kind != "bytes" else None
    sizes = Sizes(args.file) if args.kind == "bytes" else None
    while True:
        finished = bool(stop) or args.once or not alive(args.watch)
        now = clock()
        if sizes is not None:
            written = sizes.total()
            if written > progress.done:
                progress._count(written, now)
        for line in follower.lines() if follower else ():
            message = progress.feed(line, now)
            if message:
                console.message(message)
            elif not console.tty:
                console.update(progress, now)  # each STEP crossed gets its line
        console.update(progress, now, last=finished)
        if finished:
            return 0
        time.sleep(POLL_SECONDS)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=("train", "lines", "bytes"))
    parser.add_argument("file", help="the log or output file the job writes (bytes: a glob pattern of files)")
    parser.add_argument("--total", type=int, required=True, help="updates (train), lines (lines) or bytes "
                        "(bytes) in all")
    parser.add_argument("--from-byte", type=int, default=0, help="read the file from this offset (its size "
                        "before the job started, for a log that is appended to)")
    parser.add_argument("--prefix", default="", help="lines: count only the lines starting with this")
    parser.add_argument("--label", default=None, help="the [label] of each line (default: the kind)")
    parser.add_argument("--unit", default="lines", help="lines: what a line is (sentences, lines)")
    parser.add_argument("--step", type=float, default=5.0, help="not on a terminal: a line every STEP "
                        "percent (default 5)")
    parser.add_argument("--watch", type=int, default=0, help="the id of the process that started this one "
                        "(the shell's $BASHPID): stop when it is gone")
    parser.add_argument("--once", action="store_true", help="read the file once, print, and stop")
    args = parser.parse_args(argv)
    args.label = args.label or args.kind
    return args


def main(argv=None):
    return follow(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
