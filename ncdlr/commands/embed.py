"""Embed a prepared image dataset with a frozen encoder into a feature table (parquet), or cache its activations.

The table (columns embedding list<float32>, label, split, class_name, source_id; class metadata in the
schema) feeds `ncdlr train --features`, `ncdlr estimate-k --features` and fast CPU experiments. Ray Data
streams the shards (local or s3://), decodes them with the eval transform and runs the encoder in a pool
of --actors model actors (map_batches). Undecodable images are left out, counted and logged.

With --trainable-blocks B (B >= 1) it writes an *activation cache* instead (a folder of parquet parts):
--views A random training crops of every known/novel image and one centre view of the others, each run
through everything before the encoder's last B blocks and stored as float16. `ncdlr train --features` on
that folder trains the last B blocks and the head, each step taking two different cached crops of an image
as its two views: the paper's regime (last block trained on augmented views) at close to head-only cost.
Parts are written as they fill; run the same command again to resume after an interruption.
Disk: A x 2 x (activation size) bytes per training image — efficientnet_lite0 at 160 px, last block:
192x5x5 -> 9.6 kB per view; ViT-B/16 at 224 px: 197x768 tokens -> 303 kB per view (docs/activation-cache.md).

Examples:
  ncdlr embed --data s3://bucket/openclipart --encoder efficientnet_lite0 --image-size 160 --out feats.parquet
  ncdlr embed --data s3://bucket/openclipart --encoder efficientnet_lite0 --image-size 160 \\
      --trainable-blocks 1 --views 8 --out s3://bucket/openclipart-lite0-b1-v8
  ncdlr train --config configs/openclipart.yaml --features s3://bucket/openclipart-lite0-b1-v8
"""

from __future__ import annotations

import argparse
import json

NAME = "embed"
HELP = "write a feature table of a prepared dataset with a frozen encoder (Ray Data, model actors)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", required=True, metavar="URI", help="prepared dataset (local or s3://)")
    parser.add_argument("--out", required=True, metavar="URI", help="output parquet file (local or s3://)")
    parser.add_argument("--encoder", default="efficientnet_lite0",
                        help="timm name, efficientnet_lite0 (offline ImageNet weights) or tiny_cnn")
    parser.add_argument("--pretrained", default="", help="DINO-format checkpoint for timm encoders (path or s3://)")
    parser.add_argument("--image-size", type=int, default=224, help="eval crop size (160 is a good CPU choice)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--actors", type=int, default=1, help="model actors (one encoder copy each)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (and CPUs) per actor")
    parser.add_argument("--pass-rows", type=int, default=0, metavar="N",
                        help="images per encoder pass inside an actor, the last pass padded, so an image's output "
                             "does not depend on how Ray Data batched it; 0 (default): 2^17 pixels' worth, within "
                             "1..64 (5 at 160 px, 2 at 224; small passes stay in the CPU caches)")
    parser.add_argument("--splits", default="known,novel,val,test", help="comma-separated splits to embed")
    parser.add_argument("--trainable-blocks", type=int, default=0, metavar="B",
                        help="0 (default): pooled embeddings for head-only training; B >= 1: an activation cache "
                             "at the input of the encoder's last B blocks, for training them (--out is a folder)")
    parser.add_argument("--views", type=int, default=8, metavar="A",
                        help="activation cache: random training crops cached per known/novel image (>= 2; default 8)")
    parser.add_argument("--crop-scale-min", type=float, default=0.5,
                        help="activation cache: RandomResizedCrop's smallest area fraction (as data.crop_scale_min)")
    parser.add_argument("--seed", type=int, default=0, help="activation cache: seed of the crops (with each image's id)")
    parser.add_argument("--photometric", choices=("none", "uno"), default="none",
                        help="activation cache: colour augmentation of each crop after the crop and flip: none "
                             "(default) or uno (UNO's discovery views: colour jitter p 0.5, greyscale p 0.1, blur "
                             "p 0.2; the boxes and flips stay those of none, so two caches pair crop by crop)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from ncdlr.service.embed import embed_dataset
    from ncdlr.service.entry import init_ray, run_main

    def main() -> int:
        init_ray(cpus_needed=args.actors * args.threads + 1)
        if args.trainable_blocks:
            from ncdlr.service.embed import embed_activations

            stats = embed_activations(
                args.data, args.out, encoder=args.encoder, pretrained=args.pretrained, image_size=args.image_size,
                blocks=args.trainable_blocks, views=args.views, crop_scale=(args.crop_scale_min, 1.0), seed=args.seed,
                photometric=args.photometric, batch_size=args.batch_size, num_actors=args.actors,
                threads_per_actor=args.threads,
                splits=tuple(s for s in args.splits.split(",") if s), progress=not args.no_progress,
                pass_rows=args.pass_rows)
            print(json.dumps(stats))
            print(args.out)
            return 0
        stats = embed_dataset(args.data, args.out, encoder=args.encoder, pretrained=args.pretrained,
                              image_size=args.image_size, batch_size=args.batch_size, num_actors=args.actors,
                              threads_per_actor=args.threads, splits=tuple(s for s in args.splits.split(",") if s),
                              pass_rows=args.pass_rows)
        print(json.dumps(stats))
        print(args.out)
        return 0

    return run_main("ncdlr embed", main)
