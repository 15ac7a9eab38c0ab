"""Patch ``ngram_block``: ``--no-repeat-ngram-size`` blocks repeats of the
tokens generated so far.

fairseq's beam search calls ``NGramRepeatBlock(tokens, lprobs, bsz,
beam_size, step)`` with ``tokens`` the whole buffer, ``(bsz * beam,
max_len + 2)``, of which only the first ``step + 1`` positions hold tokens
(the rest is padding). The Python fallback (fairseq 0.12.2 and ve-fairseq
0.12.3, ``NGramRepeatBlock._no_repeat_ngram``) takes the n-gram prefix to
look for as::

    ngram_to_check = cpu_tokens[bbsz_idx][-(self.no_repeat_ngram_size - 1) :]

i.e. the last n-1 positions of the *buffer*: padding, which never matches a
generated prefix, so nothing is ever blocked (a beam search with
``no_repeat_ngram_size=2`` repeats as many bigrams as one without it). The
fallback runs whenever fairseq's CUDA extension ``ngram_repeat_block_cuda``
is not built or there is no GPU: on the CPU always, and on GPUs for the
fairseq builds that do not ship the extension (the PyPI wheels).

The fix hands the fallback the generated tokens only, ``tokens[:, :step + 1]``;
the rest of fairseq's loop is unchanged. The CUDA extension, where it is built
and used, is left alone (it indexes by ``step``).
"""


def install() -> None:
    """Idempotent."""
    from fairseq.ngram_repeat_block import NGramRepeatBlock

    from fairseq_dnas.fairseq_patches import is_patched, mark

    if is_patched(NGramRepeatBlock._no_repeat_ngram):
        return
    no_repeat_ngram = NGramRepeatBlock._no_repeat_ngram

    def _no_repeat_ngram(self, tokens, lprobs, bsz: int, beam_size: int, step: int):
        return no_repeat_ngram(self, tokens[:, : step + 1], lprobs, bsz, beam_size, step)

    _no_repeat_ngram.__wrapped__ = no_repeat_ngram
    _no_repeat_ngram.__doc__ = no_repeat_ngram.__doc__
    NGramRepeatBlock._no_repeat_ngram = mark(_no_repeat_ngram, "ngram_block")
