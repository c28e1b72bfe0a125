"""Briefly pretrain the shapes-world VLM (supervised next-token training), stopped early on purpose.

    python -m shapes_world.pretrain_vlm --seed 0 --out assets/tiny/shapes_vlm

Builds the tiny Qwen2.5-VL of `shapes_world.vlm_model` (random init, fixed seed) and trains it on
shapes-world questions of the TRAIN split (`shapes_world.tasks:vlm_records`) with the targets
`<answer>{answer}</answer><|im_end|>`, laid out exactly as the RL adapter lays out a prompt (same
chat template, format prompt, image resize). Two phases, both short on purpose:
  1. `--iters` steps on the true answers: the model learns the format and some perception
     (it is stopped long before it is good at it);
  2. `--bias-iters` steps where each target is, with probability `--bias`, replaced by a fixed
     DEFAULT answer of its task (a biased teacher), so the pretrained policy is right only some of
     the time and greedy decoding often gives the default: the deficit RL with a verifier removes.
The questions are drawn balanced (`vlm_records`: each count 0-3, each colour and yes/no equally often),
so phase 1 cannot score by answering the commonest answer: it learns some perception or nothing.
Validation uses train-split scenes held out of the training pool; the held-out (eval split)
numbers are printed for reference only. The defaults made assets/tiny/shapes_vlm, bit for bit on an AVX-512 CPU (about 16 minutes
on one CPU core; teacher-forced held-out greedy accuracy 0.54 after phase 1, 0.37 after phase 2, with chance
at 0.33 over count, colour and yes/no questions).

Notation: B examples per batch, L padded sequence length, V vocabulary.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch

from shapes_world.tasks import vlm_records
from shapes_world.vlm_model import FORMAT_PROMPT, MODEL_SIDE, build, save
from vlm.images import ResizePolicy, resize
from vlm.prompts import build_messages, format_text

TASKS = ["count", "attribute", "relation"]
DEFAULT = {"count": "2", "attribute": "blue", "relation": "yes"}   # phase 2's biased answers
SCENE = {"size": 56, "max_objects": 3}
IGNORE = -100


def encode(rec: dict, processor) -> dict:
    """One record -> model inputs with labels on the completion only (prompt as the RL adapter builds it)."""
    side = ResizePolicy(28, MODEL_SIDE * MODEL_SIDE, MODEL_SIDE * MODEL_SIDE)
    image, _ = resize(rec["images"][0].convert("RGB"), side)
    messages = build_messages(format_text(rec["prompt"], FORMAT_PROMPT), 1, None)
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    enc = processor(text=[text], images=[image], return_tensors="pt")
    tok = processor.tokenizer
    target = tok(f"<answer>{rec['answer']}</answer>", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    prompt = enc["input_ids"][0]                                                    # [Lp]
    target = torch.tensor(target, dtype=torch.long)                                 # [Lc]
    return {"input_ids": torch.cat([prompt, target]),                               # [L]
            "mm_token_type_ids": torch.cat([enc["mm_token_type_ids"][0], torch.zeros_like(target)]),
            "labels": torch.cat([torch.full_like(prompt, IGNORE), target]),
            "pixel_values": enc["pixel_values"], "image_grid_thw": enc["image_grid_thw"]}


def collate(examples: list[dict], pad_id: int) -> dict:
    """Right-padded batch: input_ids / attention_mask / labels [B, L], pixels concatenated."""
    width = max(e["input_ids"].numel() for e in examples)

    def pad(key: str, value: int) -> torch.Tensor:
        rows = [torch.nn.functional.pad(e[key], (0, width - e[key].numel()), value=value) for e in examples]
        return torch.stack(rows)                                                    # [B, L]

    ids = pad("input_ids", pad_id)
    lengths = torch.tensor([e["input_ids"].numel() for e in examples])
    return {"input_ids": ids, "attention_mask": (torch.arange(width)[None] < lengths[:, None]).long(),
            "mm_token_type_ids": pad("mm_token_type_ids", 0), "labels": pad("labels", IGNORE),
            "pixel_values": torch.cat([e["pixel_values"] for e in examples]),
            "image_grid_thw": torch.cat([e["image_grid_thw"] for e in examples])}


def answer_position(labels: torch.Tensor) -> torch.Tensor:
    """[B] position of the `<answer>` label: the logits there predict the answer token (labels shift by one)."""
    return (labels != IGNORE).float().argmax(1)


@torch.no_grad()
def answer_stats(model, batches: list[dict]) -> dict:
    """Teacher-forced answer accuracy (greedy) and mean gold-answer probability (~ sampled score)."""
    model.eval()
    hits, probs = [], []
    for batch in batches:
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits.float()   # [B, L, V]
        pos = answer_position(batch["labels"])                                      # [B]
        rows = torch.arange(len(pos))
        gold = batch["labels"][rows, pos + 1]                                       # [B]
        p = logits[rows, pos].softmax(-1)                                           # [B, V]
        hits.append((p.argmax(-1) == gold).float())
        probs.append(p[rows, gold])
    model.train()
    return {"greedy": round(float(torch.cat(hits).mean()), 4), "prob": round(float(torch.cat(probs).mean()), 4)}


def batches_of(records: list[dict], processor, size: int) -> list[dict]:
    pad = processor.tokenizer.pad_token_id
    return [collate([encode(r, processor) for r in records[i:i + size]], pad) for i in range(0, len(records), size)]


def biased(rec: dict, rng: random.Random, bias: float) -> dict:
    """With probability `bias`, the record with its answer replaced by its task's DEFAULT answer."""
    return {**rec, "answer": DEFAULT[rec["task"]]} if rng.random() < bias else rec


def fit(model, processor, pool: list, evals: dict, args, iters: int, bias: float, seed: int) -> dict:
    """`iters` AdamW steps (a fresh optimizer and RNG per phase, so a phase can resume from a saved model)."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    pad, row, start = processor.tokenizer.pad_token_id, {}, time.time()
    model.train()
    for it in range(1, iters + 1):
        batch = collate([encode(biased(r, rng, bias), processor) for r in rng.sample(pool, args.batch)], pad)
        loss = model(**batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if it % args.log_every == 0 or it == iters:
            row = {"bias": bias, "iter": it, "loss": round(loss.item(), 4), "time_s": round(time.time() - start, 1),
                   **{name: answer_stats(model, b) for name, b in evals.items()}}
            print(json.dumps(row), flush=True)
    return row


def initial_model(init: str | None, build, seed: int):
    """(model, processor): the saved model in folder `init`, else `build(seed=seed)` (a fresh one)."""
    if init:
        from transformers import AutoModelForImageTextToText, AutoProcessor

        return AutoModelForImageTextToText.from_pretrained(init), AutoProcessor.from_pretrained(init)
    return build(seed=seed)


def train(args) -> dict:
    """Pretrain (phase 1: clean answers; phase 2: biased answers) and save; returns the last log row."""
    start = time.time()
    torch.set_num_threads(args.threads)
    model, processor = initial_model(args.init, build, args.seed)
    pool = vlm_records(args.pool + args.val, "train", TASKS, seed=0, **SCENE)
    pool, val = pool[:args.pool], batches_of(pool[args.pool:], processor, 64)
    held_out = batches_of(vlm_records(args.val, "eval", TASKS, seed=0, **SCENE), processor, 64)
    evals = {"val": val, "held_out": held_out}
    row = fit(model, processor, pool, evals, args, args.iters, 0.0, args.seed) if args.iters else {}
    if args.bias_iters:
        row = fit(model, processor, pool, evals, args, args.bias_iters, args.bias, args.seed + 1)
    save(model, processor, args.out)
    print(f"saved {args.out} in {time.time() - start:.0f} s", flush=True)
    return row


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="folder to save_pretrained the model and processor into")
    ap.add_argument("--iters", type=int, default=3000, help="phase 1: optimizer steps on the true answers")
    ap.add_argument("--bias-iters", type=int, default=200, help="phase 2: steps on answers biased to DEFAULT")
    ap.add_argument("--bias", type=float, default=0.5, help="phase 2: probability a target becomes DEFAULT")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: fast for this size, and "
                    "the committed weights were made with 1; other counts round differently)")
    ap.add_argument("--init", default=None, help="start from this saved model instead of a fresh one")
    ap.add_argument("--batch", type=int, default=32, help="examples per optimizer step")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--pool", type=int, default=8192, help="training records (train split)")
    ap.add_argument("--val", type=int, default=128, help="validation records (train split, not trained on)")
    ap.add_argument("--log-every", type=int, default=25, help="validate every this many steps")
    args = ap.parse_args(argv)
    if args.iters < 0 or args.bias_iters < 0 or args.iters + args.bias_iters < 1 or args.batch < 1:
        ap.error("--iters and --bias-iters must be >= 0 with a positive sum, and --batch >= 1")
    if args.pool < args.batch or not 0.0 <= args.bias <= 1.0 or args.threads < 1:
        ap.error("--pool must be >= --batch, --bias in [0, 1] and --threads >= 1")
    return args


if __name__ == "__main__":
    train(parse())
