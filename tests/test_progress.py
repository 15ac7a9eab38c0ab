"""The console progress of long recipe steps: fairseq_dnas/recipes/progress.py
reads real fairseq logs (both logging layouts, simple and json formats) and
generate output, and examples/common.sh's start_progress/stop_progress never
hide the job's exit status nor leave a follower behind."""

import io
import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # (not helpers: no fairseq import)
from fairseq_dnas.recipes import progress

COMMON = os.path.join(ROOT, "examples", "common.sh")
PROGRESS = ["-m", "fairseq_dnas.recipes.progress"]

# Lines of real fairseq-train logs of a tiny transformer_hnas_gigaword run
# (30 updates, --log-interval 5, --validate-interval-updates 10, ROUGE on),
# as examples/gigaword/train.sh's log has them (fairseq_dnas/recipes/run_fairseq.py: Python's
# logging configured before fairseq's, hence "INFO:name:message").
RUN_FAIRSEQ_LOG = """\
INFO:fairseq.trainer:begin training epoch 1
INFO:fairseq_cli.train:Start iterating over samples
INFO:train_inner:epoch 001:      5 / 20 loss=6.572, nll_loss=6.58, ppl=95.69, wps=685.9, ups=10.71, wpb=64, bsz=16, num_updates=5, lr=0.000894427, gnorm=2.448, train_wall=1, hnas_u_L00=0.0999, wall=8
INFO:train_inner:epoch 001:     10 / 20 loss=6.152, nll_loss=6.159, ppl=71.45, wps=982, ups=15.34, wpb=64, bsz=16, num_updates=10, lr=0.000632456, gnorm=2.373, train_wall=0, hnas_u_L00=0.0998, wall=8
INFO:fairseq_cli.train:begin validation on "valid" subset
INFO:fairseq.tasks.fairseq_task:can_reuse_epoch_itr = True
INFO:valid:epoch 001 | valid on 'valid' subset | loss 5.609 | nll_loss 5.573 | ppl 47.59 | rouge1 0.67 | rouge2 0 | rougeL 0.67 | wps 75.8 | wpb 60 | bsz 15 | num_updates 10
INFO:fairseq.checkpoint_utils:Saved checkpoint /tmp/ck/checkpoint_1_10.pt (epoch 1 @ 10 updates, score 0.67) (writing took 0.1110498609999695 seconds)
INFO:train_inner:epoch 001:     15 / 20 loss=5.656, nll_loss=5.647, ppl=50.11, wps=162.1, ups=2.53, wpb=64, bsz=16, num_updates=15, lr=0.000516398, gnorm=2.071, train_wall=0, hnas_u_L00=0.0997, wall=10
INFO:train_inner:epoch 001:     20 / 20 loss=5.142, nll_loss=5.099, ppl=34.27, wps=838.7, ups=13.1, wpb=64, bsz=16, num_updates=20, lr=0.000447214, gnorm=1.743, train_wall=0, hnas_u_L00=0.0997, wall=11
INFO:train:epoch 001 | loss 5.881 | nll_loss 5.871 | ppl 58.54 | wps 334.1 | ups 5.22 | wpb 64 | bsz 16 | num_updates 20 | lr 0.000447214 | gnorm 2.159 | train_wall 2 | hnas_u_L00 0.0997 | wall 11
INFO:train_inner:epoch 002:      5 / 20 loss=5.088, nll_loss=5.056, ppl=33.28, wps=224.9, ups=3.51, wpb=64, bsz=16, num_updates=25, lr=0.0004, gnorm=1.541, train_wall=1, hnas_u_L00=0.0996, wall=12
INFO:train_inner:epoch 002:     10 / 20 loss=4.763, nll_loss=4.7, ppl=26, wps=636.1, ups=9.94, wpb=64, bsz=16, num_updates=30, lr=0.000365148, gnorm=1.271, train_wall=0, hnas_u_L00=0.0995, wall=13
INFO:fairseq_cli.train:Stopping training due to num_updates: 30 >= max_update: 30
INFO:fairseq_cli.train:begin validation on "valid" subset
INFO:valid:epoch 002 | valid on 'valid' subset | loss 4.575 | nll_loss 4.496 | ppl 22.57 | rouge1 3.33 | rouge2 0 | rougeL 3.33 | wps 439.9 | wpb 60 | bsz 15 | num_updates 30 | best_rouge1 3.33
INFO:fairseq_cli.train:done training in 6.0 seconds
"""

# The same kind of run started as python -m fairseq_cli.train (fairseq's own
# logging layout), --log-format simple, then json (12 updates, log interval 3).
FAIRSEQ_TRAIN_LOG = """\
2026-11-23 22:37:21 | INFO | fairseq_cli.train | begin dry-run validation on "valid" subset
2026-11-23 22:37:21 | INFO | train_inner | epoch 001:      3 / 20 loss=6.378, ppl=83.19, wps=2007, ups=31.17, wpb=64, bsz=16, num_updates=3, lr=0.001, gnorm=2.488, train_wall=0, hnas_u_L00=0.0999, wall=11
2026-11-23 22:37:22 | INFO | train_inner | epoch 001:      6 / 20 loss=6.101, ppl=68.63, wps=1681, ups=26.27, wpb=64, bsz=16, num_updates=6, lr=0.001, gnorm=2.556, train_wall=0, hnas_u_L00=0.0998, wall=12
2026-11-23 22:37:22 | INFO | fairseq_cli.train | begin validation on "valid" subset
2026-11-23 22:37:22 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 5.632 | ppl 49.58 | wps 9337.8 | wpb 60 | bsz 15 | num_updates 6
2026-11-23 22:37:22 | INFO | train_inner | epoch 001:      9 / 20 loss=5.683, ppl=51.38, wps=306.2, ups=4.79, wpb=64, bsz=16, num_updates=9, lr=0.001, gnorm=2.289, train_wall=0, hnas_u_L00=0.0997, wall=12
"""
JSON_LOG = """\
2026-11-23 22:38:21 | INFO | train_inner | {"epoch": 1, "update": 0.15, "loss": "6.378", "ppl": "83.19", "wps": "307.7", "ups": "4.8", "wpb": "64", "bsz": "16", "num_updates": "3", "lr": "0.001", "gnorm": "2.488", "train_wall": "1", "hnas_u_L00": "0.0999", "wall": "15"}
2026-11-23 22:38:21 | INFO | train_inner | {"epoch": 1, "update": 0.3, "loss": "6.101", "ppl": "68.63", "wps": "467.2", "ups": "7.3", "wpb": "64", "bsz": "16", "num_updates": "6", "lr": "0.001", "gnorm": "2.556", "train_wall": "0", "hnas_u_L00": "0.0998", "wall": "15"}
2026-11-23 22:38:21 | INFO | fairseq_cli.train | begin validation on "valid" subset
2026-11-23 22:38:21 | INFO | valid | {"epoch": 1, "valid_loss": "5.632", "valid_ppl": "49.58", "valid_wps": "1269.2", "valid_wpb": "60", "valid_bsz": "15", "valid_num_updates": "6"}
2026-11-23 22:38:22 | INFO | train_inner | {"epoch": 1, "update": 0.45, "loss": "5.683", "ppl": "51.38", "wps": "274.7", "ups": "4.29", "wpb": "64", "bsz": "16", "num_updates": "9", "lr": "0.001", "gnorm": "2.289", "train_wall": "0", "hnas_u_L00": "0.0997", "wall": "16"}
2026-11-23 22:38:22 | INFO | train_inner | {"epoch": 1, "update": 0.6, "loss": "5.359", "ppl": "41.05", "wps": "537.5", "ups": "8.4", "wpb": "64", "bsz": "16", "num_updates": "12", "lr": "0.001", "gnorm": "1.946", "train_wall": "0", "hnas_u_L00": "0.0996", "wall": "16"}
2026-11-23 22:38:22 | INFO | fairseq_cli.train | begin validation on "valid" subset
2026-11-23 22:38:23 | INFO | valid | {"epoch": 1, "valid_loss": "4.794", "valid_ppl": "27.74", "valid_wps": "1817.3", "valid_wpb": "60", "valid_bsz": "15", "valid_num_updates": "12", "valid_best_loss": "4.794"}
"""


def _replay(text, kind="train", total=30, step=5.0, tty=False, prefix="", seconds_per_line=1.0):
    """Feed ``text`` line by line, one line a ``seconds_per_line``, and
    update the console after each (progress.follow: after each line off a
    terminal, after each read on one)."""
    p = progress.Progress(kind, total, kind, prefix=prefix, now=0.0)
    out = io.StringIO()
    console = progress.Console(out, step, tty=tty)
    now = 0.0
    for line in text.splitlines():
        now += seconds_per_line
        message = p.feed(line, now)
        if message:
            console.message(message)
        else:
            console.update(p, now)
    console.update(p, now, last=True)
    return p, out.getvalue()


def test_train_log_of_the_recipe_gives_updates_loss_time_left_and_validations():
    p, out = _replay(RUN_FAIRSEQ_LOG, step=20)
    lines = out.splitlines()
    # Lines 3 and 4 of the log are updates 5 and 10 (t = 3 s, 4 s): 5 updates a
    # second from then on; the rate does not count the 2 s of start-up.
    assert lines[0] == "[train] update 5/30 (17%) loss 6.572 elapsed 3s"
    assert lines[1] == "[train] update 10/30 (33%) loss 6.152 elapsed 4s left 4s"
    assert lines[2] == "[train] validation at update 10: loss 5.609 ppl 47.59 rouge1 0.67 rouge2 0 rougeL 0.67"
    # Update 20 (67%) is in the bucket of 15 (60-80%): one line per 20% step.
    assert [line.split(" loss")[0] for line in lines if "validation" not in line] == [
        "[train] update 5/30 (17%)", "[train] update 10/30 (33%)", "[train] update 15/30 (50%)",
        "[train] update 20/30 (67%)", "[train] update 25/30 (83%)", "[train] update 30/30 (100%)"]
    assert lines[-1].startswith("[train] validation at update 30: loss 4.575 ppl 22.57 rouge1 3.33")
    assert "left" not in lines[-2]  # done: nothing left
    assert p.done == 30 and p.loss == "4.763"
    # Between two log lines the time left counts down (5 updates a second here).
    q = progress.Progress("train", 30, "train", now=0.0)
    q.feed(RUN_FAIRSEQ_LOG.splitlines()[2], 3.0)
    assert q.left(3.5) is None  # one count: no rate yet
    q.feed(RUN_FAIRSEQ_LOG.splitlines()[3], 4.0)
    assert q.left(4.0) == pytest.approx(4.0) and q.left(6.0) == pytest.approx(2.0) and q.left(9.0) == 0


def _quickstart_log(total=1500, per_epoch=157, interval=50):
    """fairseq-train's log of the Gigaword quickstart's shape (10,000 pairs,
    64 a batch: 157 updates an epoch, --log-interval 50, 1,500 updates,
    validation only at the end), as fairseq_dnas/recipes/run_fairseq.py logs it."""
    lines = []
    for n in range(1, total + 1):
        epoch, i = (n - 1) // per_epoch + 1, (n - 1) % per_epoch + 1
        if i == 1:
            lines.append(f"INFO:fairseq.trainer:begin training epoch {epoch}")
        if n % interval == 0:
            lines.append(f"INFO:train_inner:epoch {epoch:03d}:  {i:5d} / {per_epoch} loss={9 - n / 500:.3f}, "
                         f"ppl=99, wps=1000, ups=2, wpb=900, bsz=64, num_updates={n}, lr=0.001, wall={n}")
        if i == per_epoch:
            lines.append(f"INFO:train:epoch {epoch:03d} | loss 5.2 | ppl 36 | num_updates {n} | lr 0.001")
    return "\n".join(lines) + "\n"


def test_off_a_terminal_the_quickstart_shows_every_progress_line_fairseq_logs():
    """The quickstart's 1,500 updates logged every 50: the console's 5% step
    (75 updates) must not swallow one log line in three (updates 200, 350,
    500, ... never showed)."""
    _, out = _replay(_quickstart_log(), total=1500, step=5)
    shown = [int(line.split()[2].split("/")[0]) for line in out.splitlines() if line.startswith("[train] update ")]
    assert shown == list(range(50, 1501, 50))


def test_fairseq_train_layout_and_json_format_read_the_same():
    p, out = _replay(FAIRSEQ_TRAIN_LOG, total=12, step=5)
    assert p.done == 9 and p.loss == "5.683"
    assert "[train] validation at update 6: loss 5.632 ppl 49.58" in out
    j, out_json = _replay(JSON_LOG, total=12, step=5)
    assert j.done == 12 and j.loss is not None
    assert "[train] validation at update 6: loss " in out_json


def test_validation_shows_on_the_refreshed_line_and_a_terminal_gets_carriage_returns():
    p = progress.Progress("train", 30, "train", now=0.0)
    for line in RUN_FAIRSEQ_LOG.splitlines()[:5]:
        p.feed(line, 1.0)
    assert p.render(2.0).endswith("(validating)")
    _, out = _replay(RUN_FAIRSEQ_LOG, tty=True)
    assert out.endswith("\r\x1b[K[train] update 30/30 (100%) loss 4.763 elapsed 17s\n")
    # The update line is rewritten in place (one per log line read); the
    # validation lines replace it and stay.
    assert out.count("\r\x1b[K[train] update ") >= 7
    assert "\r\x1b[K[train] validation at update 10: loss 5.609" in out
    assert out.count("\n") == 3  # 2 validations + the last line


def test_lines_counts_only_complete_prefixed_lines_of_a_growing_file(tmp_path):
    path = tmp_path / "gen.tmp"
    follower = progress.Follower(str(path))
    assert follower.lines() == []  # not there yet
    path.write_text("S-0\tsource\nH-0\t-0.5\thello\nH-1\t-0.")  # the last line half written
    assert follower.lines() == ["S-0\tsource", "H-0\t-0.5\thello"]
    with open(path, "a") as f:
        f.write("7\tworld\n")
    assert follower.lines() == ["H-1\t-0.7\tworld"]
    path.write_text("H-0\tx\n")  # replaced by a shorter file: read from its start
    assert follower.lines() == ["H-0\tx"]
    p, out = _replay("S-0 a\nH-0 a\nS-1 b\nH-1 b\nH-2 c\nH-3 d\n", kind="lines", total=4, prefix="H-",
                     step=50)
    assert p.done == 4
    assert out.splitlines() == ["[lines] 1/4 lines (25%) elapsed 2s", "[lines] 2/4 lines (50%) elapsed 4s left 4s",
                                "[lines] 4/4 lines (100%) elapsed 6s"]


def test_cli_once_reads_a_log_file_and_starts_at_from_byte(tmp_path):
    log = tmp_path / "train.log"
    old = "INFO:train_inner:epoch 001: 1 / 9 loss=9.0, num_updates=1000, wall=1\n"
    log.write_text(old + RUN_FAIRSEQ_LOG)
    proc = subprocess.run([sys.executable, *PROGRESS, "train", str(log), "--total", "30", "--once",
                           "--from-byte", str(len(old))], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "update 1000" not in proc.stderr  # an earlier run's lines in the same log
    assert proc.stderr.splitlines()[-2].startswith("[train] update 30/30 (100%) loss 4.763")


def _bash(script, tmp_path, **env):
    return subprocess.run(["bash", "-c", f"set -euo pipefail; source {COMMON}; {script}"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHON": sys.executable, **env})


def _followers(path):
    ps = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if "fairseq_dnas.recipes.progress" in line and str(path) in line]


@pytest.mark.parametrize("follower", ["works", "fails"])
def test_the_job_status_survives_the_follower_and_no_follower_survives_the_script(tmp_path, follower):
    log = tmp_path / "job.log"
    kind = "train" if follower == "works" else "no-such-kind"  # progress.py exits 2 at once
    script = (f"start_progress {kind} {log} 4; "
              f"for i in 1 2 3 4; do echo \"INFO:train_inner:epoch 001: loss=1.5, num_updates=$i\" >> {log}; "
              "sleep 0.3; done; status=0; (exit 3) || status=$?; stop_progress; exit $status")
    proc = _bash(script, tmp_path)
    assert proc.returncode == 3, proc.stderr
    if follower == "works":
        assert "[train] update 4/4 (100%) loss 1.5" in proc.stderr, proc.stderr
    assert _followers(log) == []


@pytest.mark.parametrize("how", ["die", "set -e", "killed"])
def test_no_follower_outlives_a_script_that_ends_early(tmp_path, how):
    log = tmp_path / "job.log"
    end = {"die": "die 'stopped'", "set -e": "false", "killed": "kill -KILL $$"}[how]
    proc = _bash(f"start_progress train {log} 10; sleep 1; {end}; echo not reached", tmp_path)
    assert proc.returncode != 0 and "not reached" not in proc.stdout
    deadline = time.time() + 10  # a killed script's follower sees it gone within a poll
    while _followers(log) and time.time() < deadline:
        time.sleep(0.2)
    assert _followers(log) == []


def test_progress_off_and_small_files_show_nothing(tmp_path):
    log = tmp_path / "job.log"
    proc = _bash(f"start_progress train {log} 10; echo 'INFO:train_inner:x num_updates=5' >> {log}; sleep 1; "
                 "stop_progress", tmp_path, PROGRESS="0")
    assert proc.returncode == 0 and "[train]" not in proc.stderr
    out = tmp_path / "out.tmp"
    proc = _bash(f"run_with_line_progress {out} 5 encode bash -c 'seq 5 > {out}; sleep 1'", tmp_path)
    assert proc.returncode == 0 and "[encode]" not in proc.stderr  # 5 < PROGRESS_MIN_LINES
    proc = _bash(f"run_with_line_progress {out} 5 encode bash -c 'seq 5 > {out}; sleep 1; exit 4'", tmp_path,
                 PROGRESS_MIN_LINES="1")
    assert proc.returncode == 4 and "[encode] 5/5 lines (100%)" in proc.stderr, proc.stderr


# ------------------------------------------- fairseq-preprocess: bytes written

def _text(path, lines):
    path.write_text("".join(line + "\n" for line in lines))


def test_preprocess_size_names_the_files_fairseq_reads(tmp_path):
    _text(tmp_path / "train.src", ["a b c", "d e"])        # 2 lines, 5 pieces
    _text(tmp_path / "train.tgt", ["x"])                   # 1 line, 1 piece
    _text(tmp_path / "valid.src", ["a a a a"])             # 1 line, 4 pieces
    _text(tmp_path / "valid.tgt", ["y z"])                 # 1 line, 2 pieces
    _text(tmp_path / "mono", ["one two three"] * 3)        # 3 lines, 9 pieces
    pair = f"--source-lang src --target-lang tgt --trainpref {tmp_path}/train --validpref {tmp_path}/valid"
    # (pieces + one </s> a line) x 2 bytes (uint16)
    assert _bash(f"preprocess_size {pair} --joined-dictionary", tmp_path).stdout.split() == ["5", "34"]
    assert _bash(f"preprocess_size {pair} --only-source", tmp_path).stdout.split() == ["3", "24"]
    assert _bash(f"preprocess_size --only-source --trainpref {tmp_path}/mono", tmp_path).stdout.split() == \
        ["3", "24"]
    assert _bash(f"preprocess_size --only-source --trainpref {tmp_path}/mono", tmp_path,
                 VOCAB_SIZE="70000").stdout.split() == ["3", "48"]  # int32 items for a large dictionary
    assert _bash(f"preprocess_size --trainpref {tmp_path}/missing", tmp_path).stdout.split() == ["0", "0"]


def test_fairseq_preprocess_writes_the_bytes_predicted_and_shows_them(tmp_path):
    """The real fairseq-preprocess (a joined dictionary, both sides, two
    splits): its .bin files add up to what preprocess_size predicts, so the
    console's percentage ends at 100%."""
    words = "the a police said year market of to in on".split()
    for split, n in (("train", 300), ("valid", 40)):
        for side, length in (("src", 9), ("tgt", 4)):
            _text(tmp_path / f"{split}.{side}",
                  [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(length + i % 3)) for i in range(n)])
    args = (f"--source-lang src --target-lang tgt --trainpref {tmp_path}/train --validpref {tmp_path}/valid "
            "--joined-dictionary --workers 1")
    proc = _bash(f"run_fairseq_preprocess {tmp_path}/pre.log {tmp_path}/bin {args}; preprocess_size {args}",
                 tmp_path, PROGRESS_MIN_LINES="1")
    assert proc.returncode == 0, proc.stderr + (tmp_path / "pre.log").read_text()[-2000:]
    lines, predicted = map(int, proc.stdout.split())
    assert lines == 680
    written = sum(p.stat().st_size for p in (tmp_path / "bin").glob("*.bin"))
    assert written == predicted, (written, predicted)
    assert f"binarized {predicted / 1e6:.1f}/{predicted / 1e6:.1f} MB (100%)" in proc.stderr, proc.stderr
    assert "fairseq-preprocess: 680 lines" in proc.stderr


def test_bytes_kind_sums_the_files_of_a_pattern_and_stops_at_100_percent(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"x" * 300)
    (tmp_path / "b.bin").write_bytes(b"x" * 200)
    (tmp_path / "other.idx").write_bytes(b"x" * 999)  # not matched
    proc = subprocess.run([sys.executable, *PROGRESS, "bytes", str(tmp_path / "*.bin"), "--total", "1000000",
                           "--once", "--label", "prepare", "--unit", "binarized"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("[prepare] binarized 0.0/1.0 MB (0%)"), proc.stderr
    p = progress.Progress("bytes", 400, "prepare", unit="binarized")
    p._count(500, 1.0)  # worker files not yet merged away: more than the total
    assert p.percent() == 100.0 and "0.0/0.0 MB (100%)" in p.render(1.0)
