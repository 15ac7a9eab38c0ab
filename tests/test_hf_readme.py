"""The README's Hugging Face example runs as written (in a subprocess, from an empty directory)."""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_readme_hf_example_runs(tmp_path):
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    block = re.search(r"<!-- hf-example[^>]*-->\n```python\n(.*?)```", readme, re.S)
    assert block, "README.md lost its hf-example block"
    code = block.group(1)
    assert len(code.strip().splitlines()) <= 10
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "hnas [0.5, 0.5]", run.stdout
