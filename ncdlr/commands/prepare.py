"""Prepare a dataset: read a source release, build the known/novel long-tailed splits, write shards.

    ncdlr prepare DATASET [options] --out URI

DATASET is one of
  inat18          iNaturalist 2018, a seeded draw of N categories (iNat18-1K / -2K), natural tail
  herbarium19     Herbarium 2019 FGVC6, all 683 classes (342 known), natural tail
  cifar100-lt     CIFAR-100 python release, exponential tail per half (CIFAR100-50-50 / -50-100)
  imagenet100-lt  ImageNet-100 in ImageFolder layout, exponential tail per half
  fashion-mnist   Debian dataset-fashion-mnist (IDX release): 10 real classes, exponential tail per half
  openclipart     Debian openclipart-png: real clipart, natural tail (43 classes, 5.2k images)
  emoji           emoji-datasource npm packages: real drawings of two styles, classes = Unicode subcategories
  tabler          @tabler/icons npm package: real line icons (SVG, rendered), classes = the icons' categories
  phosphor        @phosphor-icons/core npm package: real icons (SVG, rendered), classes = their Figma sections
  mdi             @iconify-json/mdi npm package: Material Design Icons (SVG, rendered), classes = their categories
  synthetic       procedurally drawn shapes, written as an iNat-2018 release, prepared by inat18

The output (--out) is a local folder or s3://bucket/prefix (endpoint, region and credentials from the
standard AWS_* variables, or --endpoint-url): parquet shards of the encoded images with label, split
(known / novel / test), class_name and source_id, plus manifest.json written last, so an interrupted
build is never taken for a dataset. Labels: known classes 0..Ks-1, novel Ks..K-1 (method.md §1).
Missing or inconsistent source files stop the build with an error naming them; undecodable images are
skipped and listed in the manifest (extra.skipped_images). `ncdlr prepare DATASET --help` explains each
dataset's options and the recommended values.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from ncdlr.data.builders import (cifar100, emoji, fashion_mnist, herbarium19, imagenet100, inat18, mdi, openclipart,
                                 phosphor, synthetic, tabler)
from ncdlr.data.builders.common import SourceFormatError
from ncdlr.data.manifest import DatasetFormatError, Manifest
from ncdlr.data.storage import StorageError

NAME = "prepare"
HELP = ("prepare a dataset (iNat18, Herbarium19, CIFAR100-LT, ImageNet100-LT, Fashion-MNIST-LT, OpenClipart, Emoji, "
        "Tabler, Phosphor, MDI, synthetic) as shards")

log = logging.getLogger(__name__)


def _common(parser: argparse.ArgumentParser, *, seed_help: str) -> None:
    parser.add_argument("--out", required=True, metavar="URI",
                        help="where to write: a local folder or s3://bucket/prefix (required)")
    parser.add_argument("--seed", type=int, default=0,
                        help=f"{seed_help} Recommended: 0, the seed of every number we report (default 0)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a prepared dataset already at --out (default: refuse)")
    parser.add_argument("--endpoint-url", metavar="URL",
                        help="S3 endpoint for s3:// URIs, e.g. http://127.0.0.1:9000 (default: AWS_ENDPOINT_URL, "
                             "else AWS)")
    parser.add_argument("--shard-mb", type=int, default=128, metavar="MB",
                        help="image payload per parquet shard; 128 keeps one Ray read task light and S3 objects "
                             "few (default 128)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (e.g. in CI logs)")


def _verify(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-verify", action="store_true",
                        help="do not decode every source image before writing (faster; broken images then reach "
                             "the shards, where training counts and logs them). Recommended: verify (default)")


def _ratios(parser: argparse.ArgumentParser, n_max: int, why: str = "the per-class maximum of the source") -> None:
    parser.add_argument("--known-ratio", type=float, default=50.0, metavar="R",
                        help="R^s = head/tail images of the known classes. Paper: 50 (default 50)")
    parser.add_argument("--novel-ratio", type=float, default=50.0, metavar="R",
                        help="R^u of the novel classes. Paper: 50 or 100 (default 50)")
    parser.add_argument("--n-max", type=int, default=n_max, metavar="N",
                        help=f"training images of each half's head class (default {n_max}, {why})")


def _icon_set_arguments(p: argparse.ArgumentParser, min_icons_help: str, crossed_out: str) -> None:
    """The options the icon sets (Tabler-LT, Phosphor-LT, MDI-LT) share: class size floor, test hold-out of icon families
    (an icon and its ``crossed_out`` variant), the SVG canvas, and the common ones."""
    p.add_argument("--min-icons", type=int, default=8, metavar="N", help=min_icons_help)
    p.add_argument("--test-fraction", type=float, default=0.2, metavar="F",
                   help=f"share of each class's icon families (an icon and its {crossed_out} variant) held out as "
                        "test (default 0.2)")
    p.add_argument("--min-test", type=int, default=2, metavar="N",
                   help="at least N test icon families per class (default 2)")
    p.add_argument("--render-size", type=int, default=96, metavar="PX",
                   help="square canvas an SVG is rendered on before the crop to its drawing (default 96)")
    _common(p, seed_help="Seed of the known/novel split and of the test hold-out.")


def _sub(subparsers: argparse._SubParsersAction, name: str, module: object, help_text: str) -> argparse.ArgumentParser:
    return subparsers.add_parser(name, help=help_text, description=module.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="dataset", metavar="DATASET", required=True)

    p = _sub(sub, "inat18", inat18, "iNaturalist 2018 → iNat18-1K / -2K")
    p.add_argument("--root", type=Path, required=True, metavar="DIR",
                   help="folder with train2018.json, val2018.json and train_val2018/ (required)")
    p.add_argument("--classes", type=int, required=True, metavar="N",
                   help="categories to draw: 1000 (iNat18-1K) or 2000 (iNat18-2K) as in the paper; the first "
                        "ceil(N/2) are known; the 1K draw is a prefix of the 2K draw (required)")
    _verify(p)
    _common(p, seed_help="Seed of the category permutation.")
    p.set_defaults(_build=_build_inat18)

    p = _sub(sub, "herbarium19", herbarium19, "Herbarium 2019 → Herbarium19 (683 classes, natural tail)")
    p.add_argument("--root", type=Path, required=True, metavar="DIR",
                   help="folder with train/metadata.json and validation/metadata.json (required)")
    p.add_argument("--train-dir", default="train", help="training folder under --root; 'small-train' for the "
                   "resized release (default train)")
    p.add_argument("--test-dir", default="validation", help="validation folder (our test split) under --root; "
                   "'small-validation' for the resized release (default validation)")
    _verify(p)
    _common(p, seed_help="Seed of the known/novel class split.")
    p.set_defaults(_build=_build_herbarium19)

    p = _sub(sub, "cifar100-lt", cifar100, "CIFAR-100 → CIFAR100-LT (exponential tail per half)")
    p.add_argument("--root", type=Path, required=True, metavar="DIR",
                   help="folder holding cifar-100-python/ (the python-pickle release), or that folder (required)")
    _ratios(p, n_max=500)
    _common(p, seed_help="Seed of the class split and of the shuffles inside each class.")
    p.set_defaults(_build=_build_cifar100)

    p = _sub(sub, "imagenet100-lt", imagenet100, "ImageNet-100 → ImageNet100-LT (exponential tail per half)")
    p.add_argument("--root", type=Path, required=True, metavar="DIR",
                   help="folder with train/<WNID>/*.JPEG and val/<WNID>/*.JPEG; only the 100 listed WNIDs are "
                        "read (required)")
    _ratios(p, n_max=1300)
    _verify(p)
    _common(p, seed_help="Seed of the class split and of the shuffles inside each class.")
    p.set_defaults(_build=_build_imagenet100)

    p = _sub(sub, "fashion-mnist", fashion_mnist, "Debian dataset-fashion-mnist → Fashion-MNIST-LT (real, offline)")
    p.add_argument("--root", type=Path, default=fashion_mnist.DEFAULT_ROOT, metavar="DIR",
                   help=f"folder with the four IDX files, gzipped or not (default {fashion_mnist.DEFAULT_ROOT}; "
                        "install with: apt-get install dataset-fashion-mnist)")
    _ratios(p, n_max=1000, why="of the source's 6000: 3180 training rows, about 3x OpenClipart-LT's images per "
                              "class, sized for CPU runs")
    _common(p, seed_help="Seed of the class split and of the shuffles inside each class.")
    p.set_defaults(_build=_build_fashion_mnist)

    p = _sub(sub, "openclipart", openclipart, "Debian openclipart-png → OpenClipart-LT (real, offline)")
    p.add_argument("--root", type=Path, default=openclipart.DEFAULT_ROOT, metavar="DIR",
                   help=f"the openclipart-png tree (default {openclipart.DEFAULT_ROOT}; "
                        "install with: apt-get install openclipart-png)")
    p.add_argument("--format", choices=("png", "jpeg"), default="png",
                   help="encoding of the flattened images: png keeps clipart edges exactly and is smaller here "
                        "(88 MB vs 97 MB for jpeg quality 95); recommended png (default png)")
    p.add_argument("--jpeg-quality", type=int, default=95, metavar="Q",
                   help="JPEG quality 1..95 with --format jpeg (default 95). Lower makes a copy small enough to "
                        "carry, e.g. to a GPU machine: at --max-side 160, quality 70 is 17 MB in all against "
                        "35 MB at 95")
    p.add_argument("--max-side", type=int, default=512, metavar="PX",
                   help="shrink so the longer side is at most PX pixels (0 keeps the cropped size, up to 16000 "
                        "px for a few drawings). 512 leaves room for 224-px crops and keeps decoding cheap "
                        "(default 512)")
    p.add_argument("--min-images", type=int, default=15, metavar="N",
                   help="drop classes with fewer images (default 15, which gives 43 classes)")
    p.add_argument("--test-fraction", type=float, default=0.2, metavar="F",
                   help="share of each class held out as test (default 0.2)")
    p.add_argument("--min-test", type=int, default=3, metavar="N", help="at least N test images per class (default 3)")
    p.add_argument("--keep-duplicates", action="store_true",
                   help="keep byte-identical copies (the package files some drawings under several classes): "
                        "45 classes / 6188 images instead of 43 / 5243; not recommended, copies leak between "
                        "train and test")
    _common(p, seed_help="Seed of the known/novel split and of the test hold-out.")
    p.set_defaults(_build=_build_openclipart)

    p = _sub(sub, "emoji", emoji, "emoji-datasource npm packages → Emoji-LT (real drawings, natural tail)")
    p.add_argument("--root", type=Path, required=True, metavar="DIR",
                   help="folder holding emoji-datasource-<style>/ for every style, e.g. DIR/node_modules after "
                        "`npm install --prefix DIR emoji-datasource-google@16.0.0 emoji-datasource-twitter@16.0.0` "
                        "(required)")
    p.add_argument("--styles", nargs="+", choices=emoji.STYLES, default=["google", "twitter"], metavar="STYLE",
                   help="drawings per emoji, one per style: any of google, twitter, apple, facebook; an emoji one "
                        "style lacks is left out (default google twitter: openly licensed drawings)")
    p.add_argument("--min-emoji", type=int, default=8, metavar="N",
                   help="drop subcategories with fewer emoji drawn in every style (default 8)")
    p.add_argument("--test-fraction", type=float, default=0.2, metavar="F",
                   help="share of each class's emoji held out as test, with all their styles (default 0.2)")
    p.add_argument("--min-test", type=int, default=2, metavar="N", help="at least N test emoji per class (default 2)")
    _common(p, seed_help="Seed of the known/novel split and of the test hold-out.")
    p.set_defaults(_build=_build_emoji)

    p = _sub(sub, "tabler", tabler, "@tabler/icons npm package → Tabler-LT (real line icons, natural tail)")
    p.add_argument("--root", type=Path, required=True, metavar="DIR",
                   help="folder holding @tabler/icons/, e.g. DIR/node_modules after "
                        "`npm install --prefix DIR @tabler/icons@3.52.0` (required)")
    p.add_argument("--styles", nargs="+", choices=tabler.STYLES, default=["outline"], metavar="STYLE",
                   help="drawings per icon, one per style: outline, filled; an icon one style lacks is left out "
                        "(default outline: every icon has it; filled only about a fifth)")
    _icon_set_arguments(p, "drop categories with fewer icons drawn in every style (default 8)", tabler.CROSSED_OUT)
    p.set_defaults(_build=_build_tabler)

    p = _sub(sub, "phosphor", phosphor, "@phosphor-icons/core npm package → Phosphor-LT (real icons, natural tail)")
    p.add_argument("--root", type=Path, required=True, metavar="DIR",
                   help="folder holding @phosphor-icons/core/, e.g. DIR/node_modules after "
                        "`npm install --prefix DIR @phosphor-icons/core@2.1.1` (required)")
    p.add_argument("--styles", nargs="+", choices=phosphor.STYLES, default=["regular"], metavar="STYLE",
                   help="drawings per icon, one per style: regular, thin, light, bold, fill, duotone (every icon "
                        "has all six); each adds one image per icon (default regular)")
    _icon_set_arguments(p, "drop classes (figma categories) with fewer icons (default 8: all 18 are kept)",
                        phosphor.CROSSED_OUT)
    p.set_defaults(_build=_build_phosphor)

    p = _sub(sub, "mdi", mdi, "@iconify-json/mdi npm package → MDI-LT (Material Design Icons, natural tail)")
    p.add_argument("--root", type=Path, required=True, metavar="DIR",
                   help="folder holding @iconify-json/mdi/, e.g. DIR/node_modules after "
                        "`npm install --prefix DIR @iconify-json/mdi@1.2.3` (required)")
    p.add_argument("--family-fraction", type=float, default=1.0, metavar="F",
                   help="keep this share of each category's icon families (a seeded draw) for a smaller set with "
                        "about the same tail (default 1: all 3980 icons filed under one category)")
    _icon_set_arguments(p, "drop categories with fewer icons (default 8)", "-outline / -off")
    p.set_defaults(_build=_build_mdi)

    p = _sub(sub, "synthetic", synthetic, "procedural long-tailed shapes, via an iNat-2018-style tree")
    p.add_argument("--classes", type=int, default=10, metavar="N",
                   help="number of classes, 2..384; half known (default 10)")
    p.add_argument("--ratio", type=float, default=10.0, metavar="R",
                   help="head/tail training images inside each half (default 10)")
    p.add_argument("--n-max", type=int, default=60, metavar="N", help="training images of each head class (default 60)")
    p.add_argument("--test-per-class", type=int, default=10, metavar="N", help="test images per class (default 10)")
    p.add_argument("--image-size", type=int, default=64, metavar="PX",
                   help="side of the square JPEGs; 32-64 for CPU tests, 224 for pretrained backbones (default 64)")
    p.add_argument("--source-dir", type=Path, metavar="DIR",
                   help="keep the generated iNat-style tree here (default: a temporary folder, removed)")
    _common(p, seed_help="Seed of everything: class looks, images, class draw, row order.")
    p.set_defaults(_build=_build_synthetic)


def _build_inat18(args: argparse.Namespace, **kw: object) -> Manifest:
    config = inat18.Inat18Config(root=args.root, num_classes=args.classes, seed=args.seed, verify=not args.no_verify)
    return inat18.build(config, args.out, **kw)


def _build_herbarium19(args: argparse.Namespace, **kw: object) -> Manifest:
    config = herbarium19.Herbarium19Config(root=args.root, seed=args.seed, verify=not args.no_verify,
                                           train_dir=args.train_dir, test_dir=args.test_dir)
    return herbarium19.build(config, args.out, **kw)


def _build_cifar100(args: argparse.Namespace, **kw: object) -> Manifest:
    config = cifar100.Cifar100LTConfig(root=args.root, known_ratio=args.known_ratio, novel_ratio=args.novel_ratio,
                                       n_max=args.n_max, seed=args.seed)
    return cifar100.build(config, args.out, **kw)


def _build_imagenet100(args: argparse.Namespace, **kw: object) -> Manifest:
    config = imagenet100.ImageNet100LTConfig(root=args.root, known_ratio=args.known_ratio,
                                             novel_ratio=args.novel_ratio, n_max=args.n_max, seed=args.seed,
                                             verify=not args.no_verify)
    return imagenet100.build(config, args.out, **kw)


def _build_fashion_mnist(args: argparse.Namespace, **kw: object) -> Manifest:
    config = fashion_mnist.FashionMnistLTConfig(root=args.root, known_ratio=args.known_ratio,
                                                novel_ratio=args.novel_ratio, n_max=args.n_max, seed=args.seed)
    return fashion_mnist.build(config, args.out, **kw)


def _build_openclipart(args: argparse.Namespace, **kw: object) -> Manifest:
    if args.format != "jpeg" and args.jpeg_quality != 95:
        raise ValueError(f"--jpeg-quality {args.jpeg_quality} applies to --format jpeg only (this is --format "
                         f"{args.format}); add --format jpeg or drop --jpeg-quality")
    config = openclipart.OpenClipartConfig(root=args.root, seed=args.seed, min_images=args.min_images,
                                           test_fraction=args.test_fraction, min_test=args.min_test,
                                           image_format=args.format.upper(), jpeg_quality=args.jpeg_quality,
                                           max_side=args.max_side,
                                           dedupe=not args.keep_duplicates)
    return openclipart.build(config, args.out, **kw)


def _build_emoji(args: argparse.Namespace, **kw: object) -> Manifest:
    config = emoji.EmojiConfig(root=args.root, styles=tuple(args.styles), seed=args.seed, min_emoji=args.min_emoji,
                               test_fraction=args.test_fraction, min_test=args.min_test)
    return emoji.build(config, args.out, **kw)


def _build_tabler(args: argparse.Namespace, **kw: object) -> Manifest:
    config = tabler.TablerConfig(root=args.root, styles=tuple(args.styles), seed=args.seed, min_icons=args.min_icons,
                                 test_fraction=args.test_fraction, min_test=args.min_test,
                                 render_size=args.render_size)
    return tabler.build(config, args.out, **kw)


def _build_phosphor(args: argparse.Namespace, **kw: object) -> Manifest:
    config = phosphor.PhosphorConfig(root=args.root, styles=tuple(args.styles), seed=args.seed,
                                     min_icons=args.min_icons, test_fraction=args.test_fraction,
                                     min_test=args.min_test, render_size=args.render_size)
    return phosphor.build(config, args.out, **kw)


def _build_mdi(args: argparse.Namespace, **kw: object) -> Manifest:
    config = mdi.MdiConfig(root=args.root, seed=args.seed, min_icons=args.min_icons,
                           family_fraction=args.family_fraction, test_fraction=args.test_fraction,
                           min_test=args.min_test, render_size=args.render_size)
    return mdi.build(config, args.out, **kw)


def _build_synthetic(args: argparse.Namespace, **kw: object) -> Manifest:
    config = synthetic.SyntheticConfig(num_classes=args.classes, ratio=args.ratio, n_max=args.n_max,
                                       test_per_class=args.test_per_class, image_size=args.image_size, seed=args.seed)
    return synthetic.build(config, args.out, source_dir=args.source_dir, **kw)


def summary(manifest: Manifest, out: str) -> str:
    """A few lines describing a written dataset."""
    counts = manifest.train_counts
    known, novel = counts[: manifest.num_known], counts[manifest.num_known:]
    skipped = manifest.extra.get("skipped_images", {}).get("count", 0)
    return "\n".join([
        f"prepared {manifest.name} at {out}",
        f"  classes: {manifest.num_known} known + {manifest.num_novel} novel",
        f"  rows: " + ", ".join(f"{split} {n}" for split, n in sorted(manifest.split_counts.items())),
        f"  train images per class: known {max(known)}→{min(known)}, novel {max(novel)}→{min(novel)}",
        f"  shards: {len(manifest.shards)}, skipped undecodable images: {skipped}",
    ])


def run(args: argparse.Namespace) -> int:
    build: Callable[..., Manifest] = args._build
    try:
        manifest = build(args, progress=not args.no_progress, overwrite=args.overwrite,
                         endpoint_url=args.endpoint_url, target_shard_bytes=args.shard_mb * 1024**2)
    except (SourceFormatError, DatasetFormatError, StorageError, FileExistsError, ValueError) as exc:
        print(f"ncdlr prepare {args.dataset}: error: {exc}", file=sys.stderr)
        return 2
    print(summary(manifest, args.out))
    return 0
