#!/usr/bin/env python
"""How far an HNAS encoder at a given starting u is from the softmax model it
is initialized from: the numbers behind ``--hybrid-init 0.01``.

    python examples/bart/hnas_distance.py --checkpoint bart.large/model.pt --data cnn_dm-bin \\
        --source-lang source --target-lang target --split valid --sentences 64 --u 0.01 0.1 0.5 1

Loads the softmax checkpoint, then for each u gives every encoder
self-attention the plugin's HNAS module with the checkpoint's own weights
(``DNASMultiheadAttention``, as ``bart_hnas_*`` / ``transformer_hnas`` build
it; u = 1 is DNAS) and compares on the first ``--sentences`` pairs of
``--split``, teacher-forced on the reference, dropout off:
  enc_rel    ||h_u - h_softmax|| / ||h_softmax|| over the encoder's real positions
  kl         mean KL(softmax model || HNAS model) of the next-token distributions (nats)
  top1       share of target positions whose most likely token is the same
One JSON line per u on stdout (``--json-out`` also writes them to a file).
"""

import argparse
import copy
import json
import sys

import torch


def swap_encoder_attention(model, u, sinkhorn_iters=1):
    """Every encoder self-attention -> the plugin's module with the same
    weights, scheme 'hnas' at u (0 < u < 1) or 'dnas' (u = 1)."""
    from fairseq_dnas.modules import DNASMultiheadAttention

    for layer in model.encoder.layers:
        old = layer.self_attn
        scheme, init = ("dnas", 0.5) if u >= 1 else ("hnas", u)
        new = DNASMultiheadAttention(old.embed_dim, old.num_heads, dropout=old.dropout_module.p, bias=True,
                                     self_attention=True, scheme=scheme, hybrid_init=init,
                                     sinkhorn_iters=sinkhorn_iters)
        missing, unexpected = new.load_state_dict(old.state_dict(), strict=False)
        assert not unexpected and set(missing) <= {"hybrid_logit"}, (missing, unexpected)
        layer.self_attn = new.to(next(old.parameters()).dtype)
    return model


def model_positions(model_cfg):
    """(max source positions, max target positions) of the checkpoint's model."""
    source = getattr(model_cfg, "max_source_positions", None) or 1024
    return int(source), int(getattr(model_cfg, "max_target_positions", None) or source)


def batch(task, split, n, max_target):
    """The first ``n`` pairs of ``split`` whose target fits the decoder (training
    skips the others too); sources arrive truncated by the task."""
    task.load_dataset(split)
    data = task.dataset(split)
    items = [data[i] for i in range(len(data)) if len(data[i]["target"]) <= max_target][:n]
    return data.collater(items)


@torch.no_grad()
def outputs(model, sample):
    net = sample["net_input"]
    enc = model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
    logits = model.decoder(net["prev_output_tokens"], encoder_out=enc)[0]
    return enc["encoder_out"][0].transpose(0, 1), logits.log_softmax(-1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="a softmax BART or transformer checkpoint")
    p.add_argument("--data", required=True, help="binarized data with the checkpoint's dictionary")
    p.add_argument("--source-lang", default="source")
    p.add_argument("--target-lang", default="target")
    p.add_argument("--split", default="valid")
    p.add_argument("--sentences", type=int, default=64)
    p.add_argument("--u", type=float, nargs="+", default=[0.01, 0.1, 0.5, 1.0], help="1 = DNAS")
    p.add_argument("--json-out")
    a = p.parse_args(argv)
    for u in a.u:
        if not 0 < u <= 1:
            sys.exit(f"[hnas_distance] error: --u {u}: give values in (0, 1] (1 = DNAS)")
    import fairseq_dnas.plugin  # noqa: F401
    from fairseq import checkpoint_utils

    from fairseq_dnas.errors import BadFile

    from fairseq.tasks.translation import TranslationConfig, TranslationTask

    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(a.checkpoint)
    except BadFile as err:
        sys.exit(f"[hnas_distance] error: {err}")
    # The data's task (translation), whatever task the checkpoint was trained
    # with (bart.large: denoising); BART's upgrade drops the <mask> row. Sources
    # are truncated to the model's positions as fine-tuning does (--truncate-source).
    max_source, max_target = model_positions(state["cfg"].model)
    task = TranslationTask.setup_task(TranslationConfig(data=a.data, source_lang=a.source_lang,
                                                        target_lang=a.target_lang, dataset_impl=None,
                                                        required_seq_len_multiple=1, train_subset="train",
                                                        truncate_source=True, max_source_positions=max_source,
                                                        max_target_positions=max_target))
    try:
        base = task.build_model(state["cfg"].model)
        base.load_state_dict(state["model"], strict=True, model_cfg=state["cfg"].model)
    except BadFile as err:
        sys.exit(f"[hnas_distance] error: {err}")
    except RuntimeError as err:
        sys.exit(f"[hnas_distance] error: {a.checkpoint}: does not fit the dictionaries of {a.data} "
                 f"({str(err).splitlines()[0]})")
    torch.manual_seed(0)
    sample = batch(task, a.split, a.sentences, max_target)
    base = base.eval()
    if getattr(base.encoder.layers[0].self_attn, "scheme", "unas") != "unas":
        sys.exit("[hnas_distance] error: give the softmax checkpoint (the one HNAS starts from)")
    h0, lp0 = outputs(base, sample)
    real = ~sample["net_input"]["src_tokens"].eq(task.source_dictionary.pad())
    target = sample["target"].ne(task.target_dictionary.pad())
    rows = []
    for u in a.u:
        model = swap_encoder_attention(copy.deepcopy(base), u).eval()
        h, lp = outputs(model, sample)
        kl = (lp0.exp() * (lp0 - lp)).sum(-1)[target]
        rows.append({"u": u, "scheme": "dnas" if u >= 1 else "hnas", "sentences": int(real.shape[0]),
                     "enc_rel": float(f"{((h - h0)[real].norm() / h0[real].norm()).item():.6g}"),
                     "kl": float(f"{kl.mean().item():.6g}"),
                     "top1": round((lp.argmax(-1) == lp0.argmax(-1))[target].float().mean().item(), 4)})
        print(json.dumps(rows[-1]), flush=True)
    if a.json_out:
        with open(a.json_out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
