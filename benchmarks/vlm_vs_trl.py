"""Seconds per optimizer step: mmrl's VLM GRPO step against TRL's `GRPOTrainer` on the same work.

Same tiny Qwen2.5-VL (built in code from vlm/tiny.py's tokenizer and processor, saved to a temp
folder), same synthetic counting prompts with images (shapes_world.standins), same prompts per step P,
group size G, max new tokens, learning rate, beta=0 (no reference model), fp32, CPU, full
fine-tuning of the language model with the vision tower frozen, HF `generate` on both sides,
one optimizer step per generation batch (TRL: per_device_train_batch_size=P*G,
gradient_accumulation_steps=1, num_iterations=1; mmrl: one microbatch of P*G).

Interleaving: TRL's own training loop runs (`trainer.train()`); a callback at each TRL
`on_step_end` runs one mmrl step (`mmrl.loop.trainer.setup`'d run: the generator's `next_batch` + the learner's `update`), so the two
alternate step by step. A TRL step is timed from the end of the previous callback to its
`on_step_end` (data loading, generation, scoring, backward, optimizer, logging included).
Optionally (`--floor`) the naive floor of benchmarks/vlm_floor.py runs in the same rotation, and
(`--ablations`) mmrl with each of its optimisations off.

TRL on the CPU runs its LM head over every position, prompt included: its compact path (completion
tokens only) is taken only where its Triton kernel runs (`trl/trainer/utils.py`, GPU). TRL's steps
alternate between that CPU behaviour ("TRL") and the compact path ("TRL compact", by switching
`trl.trainer.utils._use_triton`); the goal (TRL compact / mmrl >= 3.0 at S 448px G=8) is set on the latter.

    pip install -r benchmarks/requirements.txt
    python benchmarks/vlm_vs_trl.py [--repeats 10] [--warmup 2] [--cases S:56,M:56,S:448,S:448:8:8,S:448:8]
                                    [--floor] [--ablations]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common import Report, cases_headline, machine, median, run, table  # noqa: E402
from vlm_floor import (ABLATION_HEADER, Workload, ablation_contenders, ablation_rows, floor_contender,  # noqa: E402
                       mmrl_contender, parse_cases, profile_mmrl, vlm_options)


def trl_reward(completions, **_):
    """The same cheap reward as vlm_floor.text_length_reward."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [float(len(t) % 7) for t in texts]


def trl_trainer(w: Workload, steps: int, callback):
    from datasets import Dataset
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from trl import GRPOConfig, GRPOTrainer
    from vlm.generation import blocked_token_ids, stop_token_ids
    from vlm.prompts import format_text
    import io

    processor = AutoProcessor.from_pretrained(w.folder)
    model = AutoModelForImageTextToText.from_pretrained(w.folder, dtype=torch.float32)
    model.model.visual.requires_grad_(False)                    # mmrl's default freeze_vision=true
    blocked = blocked_token_ids(model, processor.tokenizer, stop_token_ids(model, processor.tokenizer))
    rows = [{"prompt": [{"role": "user", "content": format_text(r["prompt"], "r1")}],
             "images": [Image.open(io.BytesIO(r["images"][0])).convert("RGB")]} for r in w.records]
    n = w.prompts * w.group
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-", dir=w.root), per_device_train_batch_size=n,
        gradient_accumulation_steps=1, num_generations=w.group, max_completion_length=w.new_tokens,
        learning_rate=w.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        beta=0.0, num_iterations=1, temperature=1.0, top_p=1.0, top_k=0,
        generation_kwargs={"suppress_tokens": blocked},           # the tokens mmrl's generation blocks
        max_steps=steps, logging_steps=10 ** 6, save_strategy="no", report_to="none", bf16=False, fp16=False,
        gradient_checkpointing=False, use_cpu=True, disable_tqdm=True, seed=0, dataloader_num_workers=0)
    trainer = GRPOTrainer(model=model, reward_funcs=[trl_reward], args=args, train_dataset=Dataset.from_list(rows),
                          processing_class=processor, callbacks=[callback])
    return trainer


def lm_head_modes():
    """TRL scores the LM head over every position of its sequences (prompt included) unless its Triton kernel
    runs (GPU): `trl.trainer.utils._use_triton` picks the compact path, which scores only the completion
    tokens. Returns (set_mode, names): set_mode(1) makes TRL compact on the CPU too, set_mode(0) restores it."""
    import trl.trainer.utils as trl_utils

    original = trl_utils._use_triton

    def set_mode(mode: int) -> None:
        trl_utils._use_triton = original if mode == 0 else (lambda device: True)

    return set_mode, ("trl", "trl compact")


def make_callback(others: dict):
    """TRL's steps alternate between its CPU behaviour (every position through the LM head) and the compact
    scoring it does on GPU; one step of every other contender runs after each TRL step."""
    from transformers import TrainerCallback

    set_mode, names = lm_head_modes()

    class Interleave(TrainerCallback):
        def __init__(self):
            self.times = {**{n: [] for n in names}, **{k: [] for k in others}}
            self.mark, self.step = None, 0

        def on_train_begin(self, args, state, control, **kw):
            set_mode(0)
            self.mark = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times[names[self.step % 2]].append(time.perf_counter() - self.mark)
            self.step += 1
            set_mode(self.step % 2)                              # the next TRL step's mode
            for name, fn in others.items():
                t0 = time.perf_counter()
                fn()
                self.times[name].append(time.perf_counter() - t0)
            self.mark = time.perf_counter()

        def on_train_end(self, args, state, control, **kw):
            set_mode(0)

    return Interleave()


def vs_trl_options(ap: argparse.ArgumentParser) -> None:
    vlm_options(ap)
    ap.add_argument("--floor", action="store_true", help="also time the naive floor (benchmarks/vlm_floor.py)")


def measure(args) -> Report:
    import transformers
    import trl

    rows, ablations = [], []
    with tempfile.TemporaryDirectory(prefix="vlm-vs-trl-") as root:
        for size, side, group, new in parse_cases(args.cases, args.group, args.new_tokens):
            w = Workload(size, side, args.prompts, group, new, args.lr, root)
            others = {"mmrl": mmrl_contender(w)}
            if args.floor:
                others["floor"] = floor_contender(w)
            if args.ablations:
                others.update(ablation_contenders(w))
            cb = make_callback(others)
            warm = 2 * -(-args.warmup // 2)                       # an even count keeps TRL's two modes paired
            trainer = trl_trainer(w, warm + 2 * args.repeats, cb)
            trainer.train()
            t = {k: median(v[warm // 2:] if k.startswith("trl") else v[warm:]) for k, v in cb.times.items()}
            row = [w.label(), (side // 28) ** 2, args.prompts, group, new, t["trl"], t["trl compact"], t["mmrl"]]
            if args.floor:
                row += [t["floor"], t["trl compact"] / t["floor"], t["mmrl"] / t["floor"]]
            row += [t["trl"] / t["mmrl"], t["trl compact"] / t["mmrl"]]
            rows.append(row)
            if args.ablations:
                ablations += ablation_rows(w, {k: v[warm:] for k, v in cb.times.items()})
            if args.profile:
                print(f"\n[{w.label()}]\n" + profile_mmrl(others["mmrl"]), flush=True)
    header = ["case", "img tok/prompt", "P", "G", "max new", "TRL s/step", "TRL compact s/step", "mmrl s/step"]
    if args.floor:
        header += ["floor s/step", "TRL compact/floor", "mmrl/floor"]
    header += ["TRL/mmrl", "TRL compact/mmrl"]
    title = (f"VLM GRPO step, TRL {trl.__version__} vs mmrl (transformers {transformers.__version__}; "
             f"{machine()}; median of {args.repeats} interleaved steps after {args.warmup} warm-up; TRL compact = "
             "its LM head over completion tokens only, as on GPU)")
    tables = [table(title, header, rows)]
    if ablations:
        tables.append(table("mmrl with one optimisation off (same run)", ABLATION_HEADER, ablations))
    return Report(tables, cases_headline("TRL compact / mmrl", rows, "goal >= 3.0 at S 448px G8"))


if __name__ == "__main__":
    run(__doc__, vs_trl_options, measure, quiet=True)
