#!/usr/bin/env python
"""Train a small ViT image classifier with DNAS, HNAS or discrete attention on images it draws.

    python examples/hf/vit_shapes.py --scheme hnas --out vit_hnas.json

No download: each image is a bar on a noisy background, drawn here, and its
label is the bar's direction (horizontal, vertical, diagonal, anti-diagonal),
at a random offset, so the class is wherever the bar crosses the image: the
classifier reads it through the attention from its [CLS] token to the patches.
The model is a random-init
``ViTForImageClassification`` whose self-attention
``fairseq_dnas.hf.enable(model, scheme=...)`` switches; it trains with AdamW
and reports accuracy on images it did not train on, the loss of the first and
last steps and, for HNAS, the weights u per layer. With ``--save-dir`` the
model is saved and read back with ``hf.from_pretrained`` (scheme and u
restored) before it is tested.
"""

import argparse
import json
import sys
import time

import torch

CLASSES = ("horizontal", "vertical", "diagonal", "anti-diagonal")


def draw(count: int, size: int, generator: torch.Generator):
    """(images (count, 3, size, size), labels (count,)): one bar per image, of
    random colour, thickness and offset, label = its direction, on Gaussian noise."""
    labels = torch.randint(len(CLASSES), (count,), generator=generator)
    rows = torch.arange(size)[:, None].expand(size, size)
    cols = torch.arange(size)[None, :].expand(size, size)
    images = 0.3 * torch.randn(count, 3, size, size, generator=generator)
    for i, label in enumerate(labels.tolist()):
        offset = int(torch.randint(-size // 3, size // 3 + 1, (1,), generator=generator))
        width = int(torch.randint(1, 3, (1,), generator=generator))
        # the signed distance of each pixel from the bar's centre line
        distance = [rows - size // 2 - offset, cols - size // 2 - offset,
                    rows - cols - offset, rows + cols - (size - 1) - offset][label]
        colour = torch.rand(3, generator=generator) + 0.5
        images[i] += colour[:, None, None] * (distance.abs() < width)
    return images, labels


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scheme", choices=["unas", "dnas", "hnas", "discrete"], default="hnas",
                   help="attention of the ViT's self-attention (unas: softmax through the same code)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--train-images", type=int, default=4096)
    p.add_argument("--test-images", type=int, default=512)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--patch-size", type=int, default=8)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--hybrid-init", type=float, default=0.5, help="HNAS: initial u (the paper's 0.5)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--save-dir", default=None, help="save the trained model here and test the reloaded one")
    p.add_argument("--out", default=None, help="write the result as JSON here")
    args = p.parse_args(argv)
    for name in ("steps", "batch_size", "train_images", "test_images", "hidden", "layers", "heads"):
        if getattr(args, name) <= 0:
            sys.exit(f"error: --{name.replace('_', '-')} must be > 0; got {getattr(args, name)}")
    if args.image_size % args.patch_size or args.image_size // args.patch_size < 2:
        sys.exit(f"error: --image-size ({args.image_size}) must be a multiple of --patch-size ({args.patch_size}), "
                 "at least two patches wide")
    if args.hidden % args.heads:
        sys.exit(f"error: --hidden ({args.hidden}) must be a multiple of --heads ({args.heads})")
    return args


def build(args):
    from transformers import ViTConfig, ViTForImageClassification

    from fairseq_dnas import hf

    config = ViTConfig(image_size=args.image_size, patch_size=args.patch_size, num_channels=3,
                       hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.heads,
                       intermediate_size=4 * args.hidden, num_labels=len(CLASSES),
                       id2label=dict(enumerate(CLASSES)), label2id={c: i for i, c in enumerate(CLASSES)})
    model = ViTForImageClassification(config)
    settings = {"hybrid_init": args.hybrid_init} if args.scheme == "hnas" else {}
    return hf.enable(model, scheme=args.scheme, **settings)


@torch.no_grad()
def accuracy(model, images, labels, batch_size):
    model.eval()
    right = sum(int((model(pixel_values=images[i:i + batch_size]).logits.argmax(-1) == labels[i:i + batch_size]).sum())
                for i in range(0, len(labels), batch_size))
    return right / len(labels)


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import ViTForImageClassification

    from fairseq_dnas import hf

    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    train_x, train_y = draw(args.train_images, args.image_size, g)
    test_x, test_y = draw(args.test_images, args.image_size, g)
    model = build(args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    losses, start = [], time.perf_counter()
    model.train()
    for step in range(args.steps):
        index = torch.randint(args.train_images, (args.batch_size,), generator=g)
        loss = model(pixel_values=train_x[index], labels=train_y[index]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if (step + 1) % 50 == 0 or step + 1 == args.steps:
            print(f"[vit] step {step + 1}/{args.steps} loss {loss.item():.4f}", file=sys.stderr)
    seconds = time.perf_counter() - start
    if args.save_dir:
        model.save_pretrained(args.save_dir)
        model = hf.from_pretrained(ViTForImageClassification, args.save_dir)
    result = {
        "scheme": args.scheme, "seed": args.seed, "steps": args.steps, "batch_size": args.batch_size,
        "model": {"image_size": args.image_size, "patch_size": args.patch_size, "hidden": args.hidden,
                  "layers": args.layers, "heads": args.heads},
        "first_loss": losses[0], "last_loss": sum(losses[-10:]) / len(losses[-10:]),  # mean of the last 10 steps
        "test_images": args.test_images, "test_accuracy": accuracy(model, test_x, test_y, 256),
        "ms_per_step": 1000 * seconds / args.steps,
        "u": hf.callback.layer_weights(model) if args.scheme == "hnas" else None,  # per layer and head
    }
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
