"""Embed a prepared image dataset with a frozen encoder into a feature table (parquet).

The table (columns embedding list<float32>, label, split, class_name, source_id; class metadata in the
schema) feeds `ncdlr train --features`, `ncdlr estimate-k --features` and fast CPU experiments. Ray Data
streams the shards (local or s3://), decodes them with the eval transform and runs the encoder in a pool
of --actors model actors (map_batches). Undecodable images are left out, counted and logged.

Example:
  ncdlr embed --data s3://bucket/openclipart --encoder efficientnet_lite0 --image-size 160 --out feats.parquet
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
    parser.add_argument("--splits", default="known,novel,val,test", help="comma-separated splits to embed")


def run(args: argparse.Namespace) -> int:
    from ncdlr.service.embed import embed_dataset
    from ncdlr.service.entry import init_ray, run_main

    def main() -> int:
        init_ray(cpus_needed=args.actors * args.threads + 1)
        stats = embed_dataset(args.data, args.out, encoder=args.encoder, pretrained=args.pretrained,
                              image_size=args.image_size, batch_size=args.batch_size, num_actors=args.actors,
                              threads_per_actor=args.threads, splits=tuple(s for s in args.splits.split(",") if s))
        print(json.dumps(stats))
        print(args.out)
        return 0

    return run_main("ncdlr embed", main)
