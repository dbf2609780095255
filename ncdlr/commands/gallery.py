"""Write a static web page of every class of a run, novel clusters first, to look at what was discovered.

OUT/index.html opens from disk (no server). Each class has a section: its name (novel-NN or what
`ncdlr name` set), its training count (known: labelled images; novel: the model's pseudo-labels of the
unlabelled training images), how many predicted rows it received, its most confident thumbnails and a few
least confident ones (where errors show), its nearest known classes, and, where the predictions carry true
labels, the Hungarian-matched true class and the cluster's purity. Classes that received nothing are listed,
not hidden. Thumbnails are written to OUT/thumbs/.

Without --predictions it first predicts the run's test split into OUT/predictions (with embeddings); with
--predictions P it shows that folder of `ncdlr predict` (add --embeddings there for the nearest known classes).

Examples:
  ncdlr gallery runs/openclipart --out runs/openclipart/gallery
  ncdlr predict runs/openclipart --data /photos/new --out /tmp/new --embeddings
  ncdlr gallery runs/openclipart --predictions /tmp/new --out /tmp/new-gallery
"""

from __future__ import annotations

import argparse

NAME = "gallery"
HELP = "write a static HTML gallery of every known and discovered class of a run (opens from disk)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="run directory of `ncdlr train`")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for index.html and thumbs/")
    parser.add_argument("--predictions", default="", metavar="URI",
                        help="a folder of `ncdlr predict` (default: predict the run's test split into OUT/predictions)")
    parser.add_argument("--checkpoint", default="", help="checkpoint to use (default: the run's last)")
    parser.add_argument("--per-class", type=int, default=8, help="most confident thumbnails per class (default 8)")
    parser.add_argument("--uncertain", type=int, default=3, help="least confident thumbnails per class (default 3)")
    parser.add_argument("--endpoint-url", default="", help="S3 endpoint (default: AWS_ENDPOINT_URL)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from ncdlr.service.entry import init_ray, run_main
    from ncdlr.service.gallery import build_gallery

    def main() -> int:
        init_ray(cpus_needed=2)
        page = build_gallery(args.run, args.out, predictions=args.predictions, checkpoint=args.checkpoint,
                             per_class=args.per_class, uncertain=args.uncertain,
                             endpoint_url=args.endpoint_url or None, progress=not args.no_progress)
        print(page.absolute().as_uri())
        return 0

    return run_main("ncdlr gallery", main)
