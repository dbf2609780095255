"""Apply a trained run to data and write its predictions (a folder of parquet parts, local or s3://).

--data is one of:
  a prepared dataset (manifest.json)  the rows of --split (default test; "all" for every split), labels kept:
                                      over the test split these are exactly `ncdlr evaluate`'s predictions;
  a feature table of the run's kind   its rows as they are (e.g. the activation cache the run trained on);
  a folder or s3:// prefix of images  every .jpg/.jpeg/.png/.webp under it (recursive), any size: each is
                                      resized and centre-cropped as in evaluation. Unreadable files are
                                      counted, listed in OUT/unreadable-*.parquet and logged; nothing is dropped
                                      silently.

Each row: source_id (the file's path under the folder, or the dataset's id), pred (class index), is_novel,
name (known class name, or the novel cluster's: novel-NN or what `ncdlr name` set), confidence (cosine to the
predicted prototype), margin (to the second best), top5 + top5_score, label and split where the data has them,
and the embedding with --embeddings. Ray Data decodes the images and a pool of --actors model actors scores
them (--use-gpu: one GPU per actor). Parts are written as they fill: run the same command again to resume.
A run trained with a post-hoc fix (method.posthoc la, crt or la+crt) predicts through the fix that its
evaluation fitted on its training rows, so pred is what `ncdlr evaluate` scored; confidence and the top5
scores are then the fixed scores (for +LA cos/T - log prior), not cosines.

Examples:
  ncdlr predict runs/demo --data s3://ncdlr-demo/inat-mini --out runs/demo/predictions
  ncdlr predict runs/openclipart --data /photos/new --out s3://bucket/new-predictions --actors 2 --threads 2
"""

from __future__ import annotations

import argparse
import json
import sys

NAME = "predict"
HELP = "predict classes (known and discovered) for a prepared dataset, a feature table or a folder of images"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="run directory of `ncdlr train`")
    parser.add_argument("--data", required=True, metavar="URI",
                        help="prepared dataset, feature table, or folder / s3:// prefix of images")
    parser.add_argument("--out", required=True, metavar="URI", help="output folder of prediction parts (local or s3://)")
    parser.add_argument("--split", default="test",
                        help="prepared dataset or table: the split to predict (known, novel, val, test or all)")
    parser.add_argument("--checkpoint", default="", help="checkpoint to use (default: the run's last)")
    parser.add_argument("--embeddings", action="store_true", help="also write each row's embedding z [D]")
    parser.add_argument("--batch-size", type=int, default=64, help="images per model call (default 64)")
    parser.add_argument("--actors", type=int, default=1, help="model actors (one model copy each; default 1)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (and CPUs) per actor (default 1)")
    parser.add_argument("--use-gpu", action="store_true", help="one GPU per model actor")
    parser.add_argument("--rows-per-part", type=int, default=2048, help="rows per output part (the resume unit)")
    parser.add_argument("--endpoint-url", default="", help="S3 endpoint (default: AWS_ENDPOINT_URL)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from ncdlr.service.entry import init_ray, run_main
    from ncdlr.service.predict import predict_run

    def main() -> int:
        for flag in ("batch_size", "actors", "threads", "rows_per_part"):
            if getattr(args, flag) < 1:
                print(f"ncdlr predict: --{flag.replace('_', '-')} must be >= 1", flush=True)
                return 2
        init_ray(cpus_needed=args.actors * args.threads + 1)
        stats = predict_run(args.run, args.data, args.out, split=args.split, checkpoint=args.checkpoint,
                            embeddings=args.embeddings, batch_size=args.batch_size, num_actors=args.actors,
                            threads=args.threads, use_gpu=args.use_gpu, rows_per_part=args.rows_per_part,
                            endpoint_url=args.endpoint_url or None, progress=not args.no_progress)
        print(json.dumps(stats))
        if stats["unreadable"]:
            print(f"[ncdlr] {stats['unreadable']} unreadable file(s) listed in {args.out}/unreadable-*.parquet")
        print(args.out)
        return 0

    return run_main("ncdlr predict", main)
