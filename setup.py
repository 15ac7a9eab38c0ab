"""fairseq-dnas: doubly-normalized (DNAS) and hybrid (HNAS) attention for fairseq.

Installation is two-step on purpose; ``scripts/install.sh`` does both (see
docs/installation.md for why):

1. torch and fairseq, which this file does not pin because the right build
   depends on the machine: ``torch==2.13.0`` (CPU wheel) or a CUDA build, and
   ``ve-fairseq==0.12.3`` (Python 3.11/3.12) or ``fairseq==0.12.2`` (<= 3.10)
   installed with ``--no-deps`` so its ``torchaudio`` requirement does not drag
   in another torch.
2. ``pip install -e .``: this package plus fairseq's own runtime
   dependencies, listed below since fairseq was installed without them.
"""

import ast

from setuptools import find_packages, setup

# The names in fairseq_dnas/commands/__init__.py's COMMANDS, read without
# importing the package (its dependencies are not installed yet).
with open("fairseq_dnas/commands/__init__.py", encoding="utf-8") as _f:
    COMMANDS = next(ast.literal_eval(node.value) for node in ast.parse(_f.read()).body
                    if isinstance(node, ast.Assign) and node.targets[0].id == "COMMANDS")

# fairseq 0.12's runtime requirements minus torchaudio (only its speech models
# use it, and every torchaudio release pins an exact torch).
FAIRSEQ_RUNTIME = [
    "bitarray",
    "cffi",
    "cython",
    "hydra-core>=1.3.2",
    "numpy>=1.21.3",
    "omegaconf",
    "packaging",
    "regex",
    "sacrebleu>=1.4.12",
    "scikit-learn",
    "tqdm",
]

setup(
    name="fairseq-dnas",
    version="0.1.0",
    description=(
        "Doubly-normalized (DNAS) and hybrid (HNAS) attention for fairseq "
        "(Ding et al., 2020, 'Attention that does not Explain Away')"
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.8",
    packages=find_packages(include=["fairseq_dnas", "fairseq_dnas.*"]),
    install_requires=[
        "torch>=1.13",
        *FAIRSEQ_RUNTIME,
        "sentencepiece>=0.1.99",  # Gigaword word pieces
        "rouge-score>=0.1.2",  # ROUGE (Google's reimplementation of Perl ROUGE)
        "matplotlib>=3.5",  # analysis pictures
        # the Gigaword download (fairseq_dnas/recipes/gigaword_download.py):
        # Google Drive's confirmation pages, resumed downloads
        "gdown>=5",
    ],
    extras_require={
        "test": [
            "pytest>=7",
            # property tests of the attention math (tests/test_properties.py):
            # random shapes, padding, dtypes and scores, derandomized in CI
            "hypothesis>=6",
            # the README's test command runs the files on 2 workers (-n 2);
            # docs/testing.md
            "pytest-xdist>=3",
            # tests/analysis_fixtures.py: xdist workers share one build
            # (torch depends on it too)
            "filelock",
        ],
        # The GPU kernels (fairseq_dnas/attention/triton/). CUDA builds
        # of torch already ship a matching triton; on CPU machines it is
        # installed so that the tests run the kernels under Triton's
        # interpreter (about 1 GB; no wheels outside Linux).
        "triton": ['triton>=3.0; platform_system == "Linux"'],
        # fairseq_dnas.hf: DNAS/HNAS in Hugging Face transformers encoders.
        # Tested with transformers 5.17.0 (the project's GPU machine) and
        # 5.23.0 (newest on the index when written); Trainer needs accelerate.
        "hf": ["transformers>=5.17,<5.24", "accelerate>=1.1.0"],
    },
    # The user commands (fairseq_dnas/commands): fairseq-dnas-rouge-eval, ...;
    # each is also `python -m fairseq_dnas.commands.<name>`.
    entry_points={
        "console_scripts": [
            f"fairseq-dnas-{name.replace('_', '-')} = fairseq_dnas.commands.{name}:main" for name in COMMANDS
        ],
    },
    license="MIT",
)
