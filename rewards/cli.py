"""`mmrl rewards list` and `mmrl rewards score NAME ...`: try a reward before training."""

from __future__ import annotations

import argparse
import json
import sys

import yaml


def _list(args) -> int:
    from rewards.registry import registered

    entries = registered()
    width = max(len(n) for n in entries)
    for name, e in entries.items():
        kind = "factory" if e.factory else "function"
        print(f"{name:<{width}}  [{kind}] {e.doc}")
    return 0


def _parse_value(text: str):
    """JSON/YAML scalars and lists (`[1, 2, 3, 4]`, `0.5`), else the string itself."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _open_image(path: str, flag: str):
    from PIL import Image, UnidentifiedImageError

    try:
        return Image.open(path).convert("RGB")
    except (FileNotFoundError, UnidentifiedImageError) as e:
        raise ValueError(f"{flag} {path!r}: cannot open image ({e})") from None


def _score(args) -> int:
    from rewards.registry import resolve
    from rewards.sample import Sample
    from rewards.scorer import RewardError, RewardSet, RewardSpec

    try:
        kwargs = {}
        for item in args.set or []:
            key, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"--set {item!r} must look like key=value")
            kwargs[key] = _parse_value(value)
        if (args.output is None) == (args.output_image is None):
            raise ValueError("give exactly one of --output TEXT or --output-image PATH")
        output = args.output if args.output is not None else _open_image(args.output_image, "--output-image")
        images = [_open_image(p, "--image") for p in args.image or []]
        meta = json.loads(args.meta) if args.meta else {}
        answer = None if args.answer is None else _parse_value(args.answer)
        resolve(args.name, kwargs)  # fail early with the registry's message
        rs = RewardSet([RewardSpec(args.name, args.name.rsplit(":", 1)[-1], kwargs=kwargs, max_fail_frac=1.0)])
        sample = Sample(prompt=args.prompt, output=output, images=images, answer=answer, meta=meta, id="cli")
        scores, _ = rs.score([sample])
    except (ValueError, RewardError, json.JSONDecodeError) as e:
        print(f"mmrl: {e}", file=sys.stderr)
        return 2
    value = float(scores[0, 0])
    print("None (unscorable)" if value != value else f"{value:.6g}")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("rewards", help="list rewards or score one sample")
    rsub = r.add_subparsers(dest="rewards_command", metavar="SUBCOMMAND", required=True)
    ls = rsub.add_parser("list", help="the registered rewards, one line each")
    ls.set_defaults(func=_list)
    sc = rsub.add_parser("score", help="score one sample with a reward")
    sc.add_argument("name", help="registered name, module:function or path/to/file.py:function")
    sc.add_argument("--prompt", default="")
    sc.add_argument("--image", action="append", metavar="PATH", help="input image (repeatable)")
    sc.add_argument("--output", metavar="TEXT", help="a text completion to score")
    sc.add_argument("--output-image", metavar="PATH", help="a generated image to score")
    sc.add_argument("--answer", help="reference answer (YAML/JSON values such as [1, 2, 3, 4] are parsed)")
    sc.add_argument("--meta", help="other dataset columns as a JSON object")
    sc.add_argument("--set", action="append", metavar="KEY=VALUE", help="reward keyword argument (repeatable)")
    sc.set_defaults(func=_score)
