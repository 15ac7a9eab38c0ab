"""benchmarks/benchmark.py's whole-model sections: ``model`` (a training
update of transformer / transformer_dnas / transformer_hnas) and ``generate``
(beam search)."""

import torch

import bench_common as common
from bench_common import USER_DIR, CpuLoad, log, timed_rounds


def model_args(arch, extra):
    from fairseq import options

    import fairseq_dnas.plugin  # noqa: F401  (--user-dir registers nothing: fairseq_dnas is already imported)

    parser = options.get_training_parser()
    return options.parse_args_and_arch(
        parser, ["unused-data", "--task", "translation", "--arch", arch, "--user-dir", USER_DIR,
                 "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", *extra])


def build_models(args, archs, extra, vocab):
    from fairseq.data import Dictionary
    from fairseq.tasks.translation import TranslationTask

    d = Dictionary()
    for i in range(vocab - len(d)):
        d.add_symbol(f"wp{i}")
    models, task = {}, None
    for name, arch in archs.items():
        a = model_args(arch, extra)
        task = TranslationTask(a, d, d)
        torch.manual_seed(0)
        m = task.build_model(a).to(common.DEVICE)
        if common.DEVICE.type == "cuda":
            m.half()  # as fairseq-train --fp16 runs the model (its fp32 master copy lives in the optimizer)
        if models:  # the same weights as fairseq's transformer (HNAS: u at its init)
            missing, unexpected = m.load_state_dict(next(iter(models.values()))[0].state_dict(), strict=False)
            if unexpected or any(not k.endswith("hybrid_logit") for k in missing):
                raise RuntimeError(f"{arch}: weights do not match fairseq's transformer "
                                   f"(missing {missing}, unexpected {unexpected})")
        models[name] = (m, a)
    return models, task, d


def synthetic_batch(d, batch, src_len, tgt_len, seed=0):
    """Source left-padded with lengths in [src_len/2, src_len], target
    right-padded with lengths in [tgt_len/2, tgt_len], tokens uniform over
    the vocabulary (the first sentence of each side at full length)."""
    g = torch.Generator().manual_seed(seed)
    pad, eos, n = d.pad(), d.eos(), len(d)

    def lengths(full):
        ls = torch.randint(full // 2, full + 1, (batch,), generator=g)
        ls[0] = full
        return ls

    src_l, tgt_l = lengths(src_len), lengths(tgt_len)
    src = torch.full((batch, src_len), pad)
    tgt = torch.full((batch, tgt_len), pad)
    prev = torch.full((batch, tgt_len), pad)
    for i in range(batch):
        s = torch.randint(d.nspecial, n, (int(src_l[i]),), generator=g)
        s[-1] = eos
        src[i, src_len - len(s):] = s
        t = torch.randint(d.nspecial, n, (int(tgt_l[i]),), generator=g)
        t[-1] = eos
        tgt[i, :len(t)] = t
        prev[i, 0] = eos
        prev[i, 1:len(t)] = t[:-1]
    return {"net_input": {"src_tokens": src.to(common.DEVICE), "src_lengths": src_l.to(common.DEVICE),
                          "prev_output_tokens": prev.to(common.DEVICE)},
            "target": tgt.to(common.DEVICE), "ntokens": int(tgt_l.sum()), "nsentences": batch,
            "src_ntokens": int(src_l.sum())}


def model_sizes(args):
    if args.quick:
        tiny = ["--encoder-layers", "2", "--decoder-layers", "1", "--encoder-embed-dim", "32",
                "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
                "--encoder-attention-heads", "4", "--decoder-attention-heads", "2"]
        archs = {"transformer": "transformer", "transformer_dnas": "transformer_dnas",
                 "transformer_hnas": "transformer_hnas"}
        return archs, tiny, 200, 16, 8, "tiny (2+1 layers, hidden 32)"
    archs = {"transformer": "transformer_gigaword", "transformer_dnas": "transformer_dnas_gigaword",
             "transformer_hnas": "transformer_hnas_gigaword"}
    return archs, [], 30522, 128, 64, "Gigaword preset (12+12 layers, hidden 768, 12 heads)"


def training_steps(models, task, sample):
    """name -> one training update (label-smoothed cross-entropy, backward,
    Adam step) of that model on ``sample``."""
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

    steps = {}
    for name, (m, _) in models.items():
        m.train()
        crit = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
        opt = torch.optim.Adam(m.parameters(), lr=1e-5)

        def step(m=m, crit=crit, opt=opt):
            opt.zero_grad(set_to_none=True)
            loss, _, _ = crit(m, sample)
            loss.backward()
            opt.step()

        steps[name] = step
    return steps


def generation_calls(models, d, sample, tgt_len):
    """name -> one beam-4 generation of ``sample`` with that model."""
    from fairseq.sequence_generator import SequenceGenerator

    calls = {}
    for name, (m, _) in models.items():
        m.eval()
        # min_len = max_len: every hypothesis runs the full decoder steps
        # (tgt_len - 1 tokens and </s>: the decoder's positions end at tgt_len).
        gen = SequenceGenerator([m], d, beam_size=4, max_len_a=0, max_len_b=tgt_len - 1, min_len=tgt_len - 1)

        def call(gen=gen, m=m):
            with torch.no_grad():
                gen.generate([m], sample)

        calls[name] = call
    return calls


def model_section(args):
    archs, sizes, vocab, src_len, tgt_len, preset = model_sizes(args)
    rows = []
    for attn_dropout in (0.1, 0.0):
        extra = [*sizes, "--attention-dropout", str(attn_dropout)]
        models, task, d = build_models(args, archs, extra, vocab)
        sample = synthetic_batch(d, args.model_batch, src_len, tgt_len)
        steps = training_steps(models, task, sample)
        log(f"model {preset}, attention dropout {attn_dropout}, batch {args.model_batch}: "
            f"timing {', '.join(steps)}")
        with CpuLoad() as load:
            timing = timed_rounds(steps, 1, args.model_rounds, "transformer")
        for name, t in timing.items():
            row = {"model": name, "arch": archs[name], "preset": preset, "attention_dropout": attn_dropout,
                   "batch_sentences": args.model_batch, "target_tokens": sample["ntokens"],
                   "source_tokens": sample["src_ntokens"], "median_update_s": t["median_s"],
                   "update_times_s": t["times_s"], "time_ratio": t["ratio"],
                   "target_words_per_s": sample["ntokens"] / t["median_s"],
                   "foreign_cpu": load.foreign_fraction}
            rows.append(row)
            log(f"  {name:17s} {t['median_s']:8.2f} s/update  x{t['ratio']:.3f}  "
                f"{row['target_words_per_s']:8.1f} target words/s")
        del models, steps
    return rows


def generate_section(args):
    archs, sizes, vocab, src_len, tgt_len, preset = model_sizes(args)
    models, task, d = build_models(args, archs, [*sizes, "--dropout", "0"], vocab)
    sample = synthetic_batch(d, args.gen_batch, src_len, tgt_len, seed=3)
    calls = generation_calls(models, d, sample, tgt_len)
    log(f"generate {preset}, beam 4, {args.gen_batch} sentences x {tgt_len} tokens")
    with CpuLoad() as load:
        timing = timed_rounds(calls, 1, max(1, args.model_rounds - 2), "transformer")
    rows = []
    for name, t in timing.items():
        rows.append({"model": name, "arch": archs[name], "preset": preset, "sentences": args.gen_batch,
                     "median_s": t["median_s"], "sentences_per_s": args.gen_batch / t["median_s"],
                     "time_ratio": t["ratio"], "foreign_cpu": load.foreign_fraction})
        log(f"  {name:17s} {args.gen_batch / t['median_s']:7.2f} sentences/s  x{t['ratio']:.3f}")
    return rows
