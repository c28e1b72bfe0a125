"""mmrl's VLM training step against the naive floor of the same work in plain PyTorch/transformers.

One optimizer step of mmrl (`mmrl.loop.trainer.setup`, then one iteration of its loop: `next_batch` +
`update`) on a tiny Qwen2.5-VL built in code (`vlm/tiny.py`'s tokenizer and processor, saved to a
temp folder), against the floor: one HF `generate` of the P prompts with
`num_return_sequences=G` (images in), then one forward and backward over the P*G generated
sequences with their images (pixel values repeated per sample, as a naive loop does), a
policy-gradient surrogate on the completion tokens and one AdamW step. Both sides train the language
model fully (vision frozen), fp32, on the CPU, with the same prompts, G, max new tokens and learning
rate, and generate all P*G rows in one call (mmrl: `policy.generate_rows_per_call=P*G`). The floor
favours itself in two ways: its prompts are tokenized and its images processed once, outside the timed
step (mmrl builds them every step), and it computes no reward.
Goals: mmrl / floor <= 0.5 at S 448px G=8, <= 1.0 with 56px images.

Cases are size:side[:G[:max_new_tokens]]; the default adds G=8 at 448px, once with 32 new tokens and
once prompt-heavy (8 new tokens). `--ablations` also times mmrl with each optimisation off.

    python benchmarks/vlm_floor.py [--repeats 10] [--warmup 2] [--cases S:56,M:56,S:448,S:448:8:8,S:448:8]
                                   [--prompts 2] [--group 4] [--new-tokens 32] [--ablations] [--profile]
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path[:0] = [p for p in (HERE, REPO) if p not in sys.path]

from common import Report, cases_headline, interleaved, machine, median, run, table  # noqa: E402

# Model sizes: S is vlm/tiny.py's qwen2_5_vl (text hidden 128 x 2 layers, vision 64 x 2); M is wider/deeper.
SIZES = {
    "S": dict(text=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, mrope_section=[4, 6, 6]),
              vision=dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2, window_size=56,
                          fullatt_block_indexes=[1])),
    "M": dict(text=dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
                        num_key_value_heads=4, mrope_section=[8, 12, 12]),
              vision=dict(depth=4, hidden_size=256, intermediate_size=512, num_heads=4, window_size=112,
                          fullatt_block_indexes=[3])),
}


def build_model(folder: str, size: str, side: int) -> str:
    """A tiny Qwen2.5-VL of `size` whose processor keeps `side` x `side` images as they are."""
    from transformers import (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor,
                              Qwen2VLImageProcessor)
    from vlm import tiny

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        base, processor = tiny._build_qwen2_5_vl()          # the tokenizer, template and special ids
        c, s = base.config, SIZES[size]
        t = dict(s["text"])
        mrope = t.pop("mrope_section")
        text = dict(vocab_size=c.text_config.vocab_size, max_position_embeddings=4096,
                    rope_parameters={"rope_type": "default", "mrope_section": mrope, "rope_theta": 10000.0},
                    bos_token_id=c.text_config.bos_token_id, eos_token_id=c.text_config.eos_token_id,
                    pad_token_id=c.text_config.pad_token_id, **t)
        vision = dict(out_hidden_size=t["hidden_size"], patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                      **s["vision"])
        cfg = Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=c.image_token_id,
                               video_token_id=c.video_token_id, vision_start_token_id=c.vision_start_token_id,
                               vision_end_token_id=c.vision_end_token_id)
        model = Qwen2_5_VLForConditionalGeneration(cfg)
        model.generation_config.eos_token_id = base.generation_config.eos_token_id
        model.generation_config.pad_token_id = base.generation_config.pad_token_id
        pixels = max(side * side, 28 * 28)
        processor = Qwen2_5_VLProcessor(
            image_processor=Qwen2VLImageProcessor(min_pixels=28 * 28, max_pixels=pixels),
            video_processor=processor.video_processor, tokenizer=processor.tokenizer,
            chat_template=tiny.QWEN_TEMPLATE)
        model.save_pretrained(folder)
        processor.save_pretrained(folder)
    return folder


def text_length_reward(samples, **_):
    """A cheap reward that varies within a group (so advantages are not all zero)."""
    return [float(len(s.output) % 7) for s in samples]


class Workload:
    """One benchmark case: model folder, records, and the shared knobs."""

    def __init__(self, size: str, side: int, prompts: int, group: int, new_tokens: int, lr: float, root: str):
        from shapes_world.standins import counting

        self.size, self.side, self.prompts, self.group, self.new_tokens, self.lr = size, side, prompts, group, new_tokens, lr
        self.folder = build_model(os.path.join(root, f"qwen2_5_vl-{size}-{side}"), size, side)
        self.root = root
        self.records = counting(n=64, seed=0, width=side, height=side)
        self.pixels = max(side * side, 28 * 28)

    def label(self) -> str:
        return f"{self.size} {self.side}px G{self.group} new{self.new_tokens}"


# ------------------------------------------------------------------------------------------- mmrl
def mmrl_contender(w: Workload, tag: str = "mmrl", extra: tuple = ()):
    """`mmrl.loop.trainer.setup` and a closure running one step of its loop (the generator's batch, the learner's
    update)."""
    from mmrl.config import load_config
    from mmrl.loop.trainer import setup

    n = w.prompts * w.group
    out = tempfile.mkdtemp(prefix=f"{tag}-", dir=w.root)
    overrides = [
        f"output_dir={out}", "max_steps=100000", f"policy.model={w.folder}", "policy.lora.rank=0",
        "policy.min_pixels=784", f"policy.max_pixels={w.pixels}", "policy.max_prompt_tokens=4096",
        f"policy.max_new_tokens={w.new_tokens}", "policy.logprob_chunk=128",
        "policy.dtype=fp32", "data.train=shapes_world.standins:counting",
        f"data.train_kwargs={{n: 64, seed: 0, width: {w.side}, height: {w.side}}}", "data.eval=null",
        f"rewards=[{{name: '{os.path.join(HERE, 'vlm_floor.py')}:text_length_reward'}}]",
        f"train.prompts_per_step={w.prompts}", f"train.group_size={w.group}", "train.update_epochs=1",
        f"policy.generate_rows_per_call={n}",     # all rows in one call, as the floor's and TRL's generate
        f"train.samples_per_microbatch={n}", "train.grad_accum_steps=0", f"optim.lr={w.lr}", "optim.max_grad_norm=1.0",
        "algo.kl_beta=0.0", "eval.every=0", "checkpoint.every=0", "logging.progress=false", "precision=fp32",
    ]
    cfg = load_config(os.path.join(REPO, "configs", "tiny", "vlm_tiny.yaml"), overrides + list(extra))
    run = setup(cfg)
    state = {"step": 0, "tokens": []}

    def step():
        i = state["step"]
        batch = run.generator.next_batch(i)
        run.learner.update(batch, i)
        run.generator.receive(run.learner.version)
        state["tokens"].append(float(batch.rollout.mask.sum()) / len(batch.rollout))
        state["step"] = i + 1

    step.state, step.run = state, run
    return step


# ------------------------------------------------------------------------------------------- floor
def prompt_texts_and_images(w: Workload, processor, start: int):
    """The chat texts and decoded images of P records, exactly as mmrl's prompt builder makes them."""
    from PIL import Image
    from vlm.prompts import build_messages, format_text

    texts, images = [], []
    for rec in w.records[start:start + w.prompts]:
        img = Image.open(io.BytesIO(rec["images"][0])).convert("RGB")
        msgs = build_messages(format_text(rec["prompt"], "r1"), 1, None)
        texts.append(processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False))
        images.append(img)
    return texts, images


def floor_contender(w: Workload):
    """One generate (num_return_sequences=G) + one forward/backward of the P*G sequences + AdamW."""
    from transformers import AutoModelForImageTextToText, AutoProcessor, LogitsProcessorList
    from vlm.generation import BlockTokens, blocked_token_ids, stop_token_ids

    processor = AutoProcessor.from_pretrained(w.folder)
    tok = processor.tokenizer
    model = AutoModelForImageTextToText.from_pretrained(w.folder, dtype=torch.float32)
    model.model.visual.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=w.lr)
    stops = stop_token_ids(model, tok)
    blocked = blocked_token_ids(model, tok, stops)
    texts, images = prompt_texts_and_images(w, processor, 0)
    tok.padding_side = "left"
    enc = processor(text=texts, images=[[im] for im in images], padding=True, return_tensors="pt")
    g, state = w.group, {"tokens": []}
    per_image = enc["image_grid_thw"].prod(-1).tolist()                         # patch rows per image
    pix = torch.split(enc["pixel_values"], per_image)
    pixel_rep = torch.cat([p for p in pix for _ in range(g)])                   # [P*G*patches, C]
    grid_rep = enc["image_grid_thw"].repeat_interleave(g, 0)
    gen_kw = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=w.new_tokens,
                  num_return_sequences=g, eos_token_id=stops, pad_token_id=tok.pad_token_id,
                  logits_processor=LogitsProcessorList([BlockTokens(blocked)]))
    stop_t = torch.tensor(stops)

    def step():
        model.eval()
        with torch.no_grad():
            out = model.generate(**enc, **gen_kw)                                  # [P*G, L + T]
        model.train()
        p_len = enc["input_ids"].shape[1]
        comp = out[:, p_len:]                                                      # [N, T]
        is_stop = torch.isin(comp, stop_t)
        after = (is_stop.cumsum(1) - is_stop.long()) > 0                           # positions after the first stop
        cmask = (~after).long()                                                    # [N, T]
        attn = torch.cat([enc["attention_mask"].repeat_interleave(g, 0), cmask], 1)
        mm = torch.cat([enc["mm_token_type_ids"].repeat_interleave(g, 0), torch.zeros_like(comp)], 1)
        t = comp.shape[1]
        logits = model(input_ids=out, attention_mask=attn, mm_token_type_ids=mm, pixel_values=pixel_rep,
                       image_grid_thw=grid_rep, logits_to_keep=t + 1, use_cache=False).logits[:, :-1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, comp.unsqueeze(-1)).squeeze(-1)   # [N, T]
        adv = torch.randn(comp.shape[0], 1)
        loss = -(logp * adv * cmask).sum() / cmask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        state["tokens"].append(float(cmask.sum()) / comp.shape[0])

    step.state = state
    return step


# ------------------------------------------------------------------------------------------- profile
def profile_mmrl(step, steps: int = 3, top: int = 25) -> str:
    """cProfile of `steps` mmrl steps: cumulative time of the main phases plus the top functions."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    prof.disable()
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    total = stats.total_tt if hasattr(stats, "total_tt") else 0.0
    wanted = [("mmrl/loop/collect.py", "next_batch"), ("vlm/policy.py", "rollout"), ("vlm/policy.py", "_prompts"),
              ("vlm/features.py", "encode"), ("vlm/generation.py", "sample"), ("vlm/policy.py", "_score"),
              ("mmrl/loop/update.py", "update"), ("vlm/policy.py", "log_probs"), ("vlm/logprobs.py", "_score_layout"),
              ("vlm/logprobs.py", "token_scores"), ("vlm/batch.py", "collate"), ("torch/_tensor.py", "backward"),
              ("mmrl/loop/update.py", "optimizer_step"), ("rewards/scorer.py", "score"), ("vlm/rows.py", "prepare_rows")]
    rows = []
    for (file, line, fn), (cc, nc, tt, ct, callers) in stats.stats.items():
        for wf, wfn in wanted:
            if file.endswith(wf) and fn == wfn:
                rows.append([f"{wf}:{fn}", nc // steps, ct / steps, ct / max(total, 1e-9)])
    rows.sort(key=lambda r: -r[2])
    head = table(f"mmrl step phases (cProfile, mean of {steps} steps; total {total / steps:.3f} s/step "
                 "under the profiler)", ["function", "calls/step", "cum s/step", "share"], rows)
    stats.sort_stats("tottime").print_stats(top)
    lines = [ln for ln in buf.getvalue().splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if "ncalls" in ln), 0)
    return head + "\n\nTop functions by own time (tottime, all steps):\n" + "\n".join(lines[start:start + top + 1])


def parse_cases(text: str, group: int, new_tokens: int) -> list[tuple[str, int, int, int]]:
    """size:side[:G[:max_new_tokens]] items, comma separated; G and max new tokens default to the options."""
    out = []
    for item in text.split(","):
        parts = item.split(":")
        if parts[0] not in SIZES or not 2 <= len(parts) <= 4:
            raise SystemExit(f"--cases: {item!r} is not size:side[:G[:new_tokens]] with size one of {', '.join(SIZES)}")
        size, side = parts[0], int(parts[1])
        g = int(parts[2]) if len(parts) > 2 else group
        new = int(parts[3]) if len(parts) > 3 else new_tokens
        out.append((size, side, g, new))
    return out


# mmrl with one optimisation turned off each (--ablations); the full run is "mmrl"
ABLATIONS = {
    "no shared-prefix generation": ("policy.share_prefix_generation=false",),
    "no shared-prefix scoring (packed)": ("policy.share_prefix_scoring=false",),
    "no shared prefix, no packing": ("policy.share_prefix_generation=false", "policy.share_prefix_scoring=false",
                                     "policy.pack_sequences=false"),
    "one generate call per prompt": ("policy.generate_rows_per_call=0",),
}


def ablation_contenders(w: "Workload") -> dict:
    return {name: mmrl_contender(w, f"abl{i}", extra) for i, (name, extra) in enumerate(ABLATIONS.items())}


def ablation_rows(w: "Workload", times: dict) -> list:
    full = median(times["mmrl"])
    return [[w.label(), w.group, w.new_tokens, name, median(times[name]), median(times[name]) / full]
            for name in ABLATIONS]


ABLATION_HEADER = ["case", "G", "max new", "mmrl without", "s/step", "/ mmrl"]


def vlm_options(ap: argparse.ArgumentParser) -> None:
    """The workload options of both VLM benchmarks (this one and vlm_vs_trl.py)."""
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--cases", default="S:56,M:56,S:448,S:448:8:8,S:448:8",
                    help=f"size:image_side[:G[:max_new_tokens]], comma separated (sizes: {', '.join(SIZES)})")
    ap.add_argument("--prompts", type=int, default=2, help="prompts per step")
    ap.add_argument("--group", type=int, default=4, help="samples per prompt (G)")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--profile", action="store_true", help="also print a cProfile summary of mmrl's step")
    ap.add_argument("--ablations", action="store_true",
                    help="also time mmrl with each optimisation off (shared prefix, packing, batched generate calls)")


def measure(args) -> Report:
    rows, ablations = [], []
    with tempfile.TemporaryDirectory(prefix="vlm-floor-") as root:
        for size, side, group, new in parse_cases(args.cases, args.group, args.new_tokens):
            w = Workload(size, side, args.prompts, group, new, args.lr, root)
            mm, fl = mmrl_contender(w), floor_contender(w)
            contenders = {"mmrl": mm, "floor": fl, **(ablation_contenders(w) if args.ablations else {})}
            times = interleaved(contenders, repeats=args.repeats, warmup=args.warmup)
            m, f = median(times["mmrl"]), median(times["floor"])
            n_img = (side // 28) ** 2 if side >= 28 else 1
            rows.append([w.label(), n_img, args.prompts, group, new,
                         sum(mm.state["tokens"]) / len(mm.state["tokens"]),
                         sum(fl.state["tokens"]) / len(fl.state["tokens"]), m, f, m / f])
            if args.ablations:
                ablations += ablation_rows(w, times)
            if args.profile:
                print(f"\n[{w.label()}]\n" + profile_mmrl(mm), flush=True)
    title = (f"VLM step vs naive floor ({machine()}; median of {args.repeats} interleaved steps after "
             f"{args.warmup} warm-up)")
    header = ["case", "img tok/prompt", "P", "G", "max new", "mmrl tok/sample", "floor tok/sample",
              "mmrl s/step", "floor s/step", "mmrl/floor"]
    tables = [table(title, header, rows)]
    if ablations:
        tables.append(table("mmrl with one optimisation off (same run)", ABLATION_HEADER, ablations))
    return Report(tables, cases_headline("mmrl / floor", rows, "goal <= 0.5 at S 448px G8, <= 1.0 at 56px"))


if __name__ == "__main__":
    run(__doc__, vlm_options, measure, quiet=True)
