"""`mmrl` command line: `mmrl train CONFIG [key=value ...]`, `mmrl export SOURCE OUT_DIR [--ema] [--policy NAME]`,
`mmrl report RUN_DIR [--out FILE]`, `mmrl rewards ...`.

User errors (bad config, missing files, a broken reward) print one paragraph and exit
with code 2 (configuration) or 1 (training stopped); never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys

EXIT_CONFIG, EXIT_TRAINING = 2, 1


def _train(args) -> int:
    from mmrl.config import ConfigError, load_config

    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        return _fail(f"configuration error: {e}", EXIT_CONFIG)
    from mmrl.loop.trainer import train
    from mmrl.loop.update import NonFiniteError
    from mmrl.state.checkpoint import CheckpointError
    from rewards.scorer import RewardError

    try:
        run_dir = train(cfg)
    except ConfigError as e:
        return _fail(f"configuration error: {e}", EXIT_CONFIG)
    except (RewardError, NonFiniteError, CheckpointError) as e:
        return _fail(f"training stopped: {e}", EXIT_TRAINING)
    except KeyboardInterrupt:
        return _fail("interrupted; the last checkpoint is intact (resume with resume=auto)", 130)
    print(f"mmrl: done; run directory {run_dir}")
    from mmrl.distributed.dist import end_launched_process

    end_launched_process(0)          # under torchrun / accelerate launch: exit before gloo's teardown can abort
    return 0


def _export(args) -> int:
    from mmrl.config import ConfigError
    from mmrl.state.export import export

    try:
        out = export(args.source, args.out_dir, ema=args.ema, policy=args.policy)
    except ConfigError as e:
        return _fail(f"export error: {e}", EXIT_CONFIG)
    except OSError as e:                 # a full disk or a read-only folder: nothing is left at OUT_DIR
        return _fail(f"export failed: {e}", EXIT_TRAINING)
    print(f"mmrl: exported to {out}")
    return 0


def _report(args) -> int:
    from mmrl.reporting.report import write_report

    try:
        path = write_report(args.run_dir, args.out)
    except FileNotFoundError as e:
        return _fail(f"report error: {e}", EXIT_CONFIG)
    print(f"mmrl: report written to {path}")
    return 0


def _fail(message: str, code: int) -> int:
    print(f"mmrl: {message}", file=sys.stderr)
    return code


def parser() -> argparse.ArgumentParser:
    from mmrl.config import describe_sections

    p = argparse.ArgumentParser(prog="mmrl", description="Reinforcement learning for multimodal models.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    t = sub.add_parser("train", help="train a policy from a YAML config",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Train from CONFIG, overriding any key with dotted key=value pairs, e.g.\n"
                                   "  mmrl train configs/tiny/bandit.yaml max_steps=20 optim.lr=0.1\n\n"
                                   "Config sections and their defaults (docs/reference/config.md):\n"
                                   + describe_sections()
                                   + "\n  policy: name plus the adapter's own keys (bandit, vlm, diffusion)")
    t.add_argument("config", help="YAML file")
    t.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides, e.g. optim.lr=1e-5")
    t.set_defaults(func=_train)
    e = sub.add_parser("export", help="write a checkpoint's weights as a transformers / peft / diffusers folder",
                       description="Export the newest checkpoint of run directory SOURCE (or the checkpoint folder "
                                   "SOURCE = RUN/checkpoints/step_<n>) into the new folder OUT_DIR, loadable with "
                                   "the model's own library (docs/guides/scale-out.md).")
    e.add_argument("source", help="run directory or checkpoint directory")
    e.add_argument("out_dir", help="new (or empty) output folder")
    e.add_argument("--ema", action="store_true", help="export the EMA weights (policy_ema.safetensors)")
    e.add_argument("--policy", default="policy", metavar="NAME",
                   help="which policy of a multi-role run: 'policy' (the policy section, the default) or a name "
                        "from its `policies:`")
    e.set_defaults(func=_export)
    r = sub.add_parser("report", help="write a run's self-contained HTML report (RUN_DIR/report.html)",
                       description="Write one self-contained HTML page for run directory RUN_DIR, finished or "
                                   "still running: reward and held-out curves, evaluation tables, held-out "
                                   "images or episodes at each evaluation, before/after, timings and memory. "
                                   "Every run writes it at its end as well.")
    r.add_argument("run_dir", help="run directory (holds metrics.jsonl)")
    r.add_argument("--out", default=None, help="where to write the page (default RUN_DIR/report.html)")
    r.set_defaults(func=_report)
    from rewards.cli import add_commands

    add_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    p = parser()
    args = p.parse_args(argv)
    if not getattr(args, "func", None):
        p.print_help()
        return EXIT_CONFIG
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
