"""The Gigaword download (fairseq_dnas/recipes/gigaword_download.py, gdown)
against a stand-in HTTP server on 127.0.0.1: the archive end to end through
prepare.sh, and each way a download fails (a web page instead of the
archive, an HTTP error, no server, an archive without the sumdata files) as
one line that names the manual way, GIGAWORD_DIR; quickstart.sh offline
stops with that line before any long step. No network is needed."""

import gzip
import http.server
import io
import os
import socket
import subprocess
import sys
import tarfile
import threading

import pytest

from helpers import ROOT
from test_gigaword_recipe import FILES, _lines, make_sumdata, prepare

NO_PROXY = {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


def _release_archive(tmp_path, files=None):
    """A summary.tar.gz shaped like the harvardnlp release (training files gzipped)."""
    root = make_sumdata(tmp_path / "release" / "sumdata")
    for rel in (FILES["train_a"], FILES["train_t"]):
        with open(root / rel, "rb") as fin, gzip.open(str(root / rel) + ".gz", "wb") as fout:
            fout.write(fin.read())
        (root / rel).unlink()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root).as_posix()
            if path.is_file() and (files is None or any(rel.startswith(f) for f in files)):
                tar.add(path, arcname=f"sumdata/{rel}")
    return buf.getvalue()


class _Server:
    """Serves ``routes`` (path -> (status, content type, body)) on 127.0.0.1; counts the requests."""

    def __init__(self, routes):
        self.routes, self.requests = routes, []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                outer.requests.append(self.path)
                status, ctype, body = outer.routes.get(self.path, (404, "text/plain", b"not found"))
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(tmp_path):
    servers = []

    def start(routes):
        servers.append(_Server(routes))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def download(dest, url):
    return subprocess.run([sys.executable, "-m", "fairseq_dnas.recipes.gigaword_download", str(dest), "--url", url],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
                               **NO_PROXY})


def _error_line(stderr):
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
    return errors[0]


def test_prepare_downloads_unpacks_and_prepares_the_release(tmp_path, server):
    s = server({"/summary.tar.gz": (200, "application/gzip", _release_archive(tmp_path))})
    proc = prepare("download", tmp_path / "out", DOWNLOAD_URL=f"{s.url}/summary.tar.gz", **NO_PROXY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "fetching the public Gigaword release (about 300 MB)" in proc.stderr
    assert (tmp_path / "out/download/sumdata/train/train.article.txt").exists()  # gunzipped
    assert len(_lines(tmp_path / "out/spm/train.article")) == 60
    assert s.requests == ["/summary.tar.gz"]
    # a re-run finds the unpacked files and asks the server for nothing
    again = prepare("download", tmp_path / "out", DOWNLOAD_URL=f"{s.url}/summary.tar.gz", **NO_PROXY)
    assert again.returncode == 0 and s.requests == ["/summary.tar.gz"], again.stderr[-2000:]


@pytest.mark.parametrize("route, reason", [
    ((200, "text/html", b"<html>Google Drive can't scan this file for viruses</html>"),
     "not a gzip archive (it starts with '<html>Google Drive c')"),
    ((403, "text/html", b"<html>quota exceeded</html>"), "the server answered HTTP 403"),
])
def test_a_web_page_or_an_http_error_is_one_line_naming_gigaword_dir(tmp_path, server, route, reason):
    s = server({"/summary.tar.gz": route})
    proc = download(tmp_path / "dl", f"{s.url}/summary.tar.gz")
    line = _error_line(proc.stderr)
    assert proc.returncode == 1 and reason in line and "set GIGAWORD_DIR to its sumdata folder" in line, line
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "dl" / "summary.tar.gz").exists() and not (tmp_path / "dl" / "sumdata").exists()


def test_no_server_is_one_line_naming_gigaword_dir(tmp_path):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = download(tmp_path / "dl", f"http://127.0.0.1:{port}/summary.tar.gz")
    line = _error_line(proc.stderr)
    assert proc.returncode == 1 and "no connection to the server" in line and "GIGAWORD_DIR" in line, proc.stderr
    assert "Traceback" not in proc.stderr


def test_an_archive_without_the_sumdata_files_is_refused(tmp_path, server):
    s = server({"/summary.tar.gz": (200, "application/gzip", _release_archive(tmp_path, files=["Giga/"]))})
    proc = download(tmp_path / "dl", f"{s.url}/summary.tar.gz")
    line = _error_line(proc.stderr)
    assert proc.returncode == 1 and "the archive did not contain train/train.article.txt" in line, line


def test_quickstart_offline_stops_in_one_line_before_any_long_step(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "GIGAWORD_DIR"}
    proc = subprocess.run(["bash", os.path.join(ROOT, "examples", "gigaword", "quickstart.sh")],
                          capture_output=True, text=True, timeout=300,
                          env={**env, **NO_PROXY, "PYTHON": sys.executable, "WORK_DIR": str(tmp_path / "work"),
                               "DOWNLOAD_URL": f"http://127.0.0.1:{port}/summary.tar.gz"})
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "GIGAWORD_DIR is not set: downloading the public Gigaword release (about 300 MB)" in proc.stderr
    line = _error_line(proc.stderr)
    assert "set GIGAWORD_DIR to its sumdata folder" in line
    assert not (tmp_path / "work" / "data" / "bin").exists()
