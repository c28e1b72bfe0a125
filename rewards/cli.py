"""`mmrl rewards list`, `mmrl rewards score NAME ...` (try a reward before training) and
`mmrl rewards serve NAME ...` (serve it over HTTP for the `remote` reward: rewards/server.py)."""

from __future__ import annotations

import argparse
import json
import sys

import yaml

DEFAULT_PORT, DEFAULT_MAX_REQUEST_MB = 8000, 64.0


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


def _set_kwargs(items: list[str] | None) -> dict:
    """`--set key=value` pairs -> reward keyword arguments."""
    kwargs = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {item!r} must look like key=value")
        kwargs[key] = _parse_value(value)
    return kwargs


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
        kwargs = _set_kwargs(args.set)
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


def _serve(args) -> int:
    import os

    from rewards.registry import resolve
    from rewards.server import create_app, listen, make_server

    token = args.token or os.environ.get("MMRL_REWARD_TOKEN") or None
    try:
        if args.max_request_mb <= 0:
            raise ValueError(f"--max-request-mb must be > 0, got {args.max_request_mb}")
        if not 0 <= args.port < 65536:
            raise ValueError(f"--port must be in 0..65535, got {args.port}")
        reward = resolve(args.name, _set_kwargs(args.set))
        app = create_app(reward, args.name, token=token, max_request_bytes=int(args.max_request_mb * 2**20))
        server = make_server(app)
        sock = listen(args.host, args.port)
    except (ValueError, ImportError) as e:
        print(f"mmrl: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"mmrl: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 2
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"mmrl: serving reward {args.name!r} on http://{shown}:{port} "
          f"({'token required' if token else 'no token'}); stop with Ctrl-C", flush=True)
    server.run(sockets=[sock])
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("rewards", help="list rewards, score one sample, or serve a reward over HTTP")
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
    sv = rsub.add_parser("serve", help="serve a reward over HTTP for the 'remote' reward",
                         description="Serve REWARD (built once) at POST /score and GET /health; "
                                     "schema: rewards/wire.py.")
    sv.add_argument("name", metavar="REWARD", help="registered name, module:function or path/to/file.py:function")
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    sv.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}; 0 picks a free one")
    sv.add_argument("--token", help="require 'Authorization: Bearer TOKEN' (default: $MMRL_REWARD_TOKEN, else none)")
    sv.add_argument("--max-request-mb", type=float, default=DEFAULT_MAX_REQUEST_MB,
                    help=f"larger request bodies get 413 (default {DEFAULT_MAX_REQUEST_MB:g})")
    sv.add_argument("--set", action="append", metavar="KEY=VALUE", help="reward keyword argument (repeatable)")
    sv.set_defaults(func=_serve)
