"""Image rewards: JPEG sizes, and the CLIP-family rewards on tiny models built in code (no hub, no download).

The builders at the top (`tiny_clip_kwargs`, `hf_clip_folder`, `hpsv2_checkpoint`,
`aesthetic_checkpoint`) are also used by test_registry_contract.py.
"""

import numpy as np
import pytest
import torch
from PIL import Image

from rewards.builtin import clip
from rewards.builtin.image import jpeg_compressibility, jpeg_incompressibility
from rewards.sample import Sample

TINY_OPEN_CLIP = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 8},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}
WORDS = ["a", "photo", "of", "cat", "dog", "red", "blue"]


def tiny_clip_kwargs(seed=0):
    """open_clip kwargs for a random tiny CLIP; seeds torch so two builds get the same weights."""
    torch.manual_seed(seed)
    return {"model": "mmrl-tiny-clip", "pretrained": None, "model_config": TINY_OPEN_CLIP}


def tiny_open_clip(seed=0):
    """The same tiny open_clip model, built directly (the reference for parity checks)."""
    net, preprocess, tokenizer = clip._open_clip(**tiny_clip_kwargs(seed), device="cpu", dtype="float32")
    return net, preprocess, tokenizer


def hf_clip_folder(path, seed=0):
    """Save a tiny transformers CLIPModel and a CLIPProcessor (word-level tokenizer) to `path`."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "<s>", "</s>"] + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 2), ("</s>", 3)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                        bos_token="<s>", eos_token="</s>", model_max_length=77)
    images = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    text_cfg = dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                    num_attention_heads=2, max_position_embeddings=77, pad_token_id=0, bos_token_id=2, eos_token_id=3)
    vision_cfg = dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2)
    torch.manual_seed(seed)
    CLIPModel(CLIPConfig(text_config=text_cfg, vision_config=vision_cfg, projection_dim=16)).save_pretrained(path)
    CLIPProcessor(image_processor=images, tokenizer=tokenizer).save_pretrained(path)
    return str(path)


def hpsv2_checkpoint(path, seed=0, wrap=True):
    """A tiny open_clip state dict saved like HPS v2 ({"state_dict": ...}) or plain with "module." keys."""
    net, _, _ = tiny_open_clip(seed)
    state = net.state_dict()
    torch.save({"state_dict": state} if wrap else {f"module.{k}": v for k, v in state.items()}, path)
    return str(path)


def aesthetic_checkpoint(path, embed_dim=32, bias=None, seed=0):
    """LAION-layout MLP weights: random (seeded), or all zero with final bias `bias` (score == bias)."""
    torch.manual_seed(seed)
    mlp = clip.aesthetic_mlp(embed_dim)
    if bias is not None:
        for p in mlp.parameters():
            torch.nn.init.zeros_(p)
        mlp["layers"][7].bias.data.fill_(bias)
    state = mlp.state_dict()
    if str(path).endswith(".safetensors"):
        from safetensors.torch import save_file

        save_file(state, str(path))
    else:
        torch.save(state, path)
    return str(path)


def image_samples():
    rng = np.random.default_rng(0)
    noisy = Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8))
    return [Sample("a photo of a cat", Image.new("RGB", (48, 40), (200, 30, 30))),
            Sample("a red dog", noisy),
            Sample("a photo of a blue cat", "not an image"),
            Sample("a dog", Image.new("RGBA", (20, 36), (0, 90, 250, 128)))]


def manual_cos(net, preprocess, tokenizer, samples):
    with torch.no_grad():
        img = net.encode_image(torch.stack([preprocess(s.output.convert("RGB")) for s in samples]))
        txt = net.encode_text(tokenizer([s.prompt for s in samples]))
    return torch.nn.functional.cosine_similarity(img, txt, dim=-1).tolist()


# ---------------------------------------------------------------- JPEG (DDPO)

def test_jpeg_flat_is_more_compressible_than_noise():
    samples = image_samples()
    inc, comp = jpeg_incompressibility(samples), jpeg_compressibility(samples)
    assert inc[2] is None and comp[2] is None
    assert all(v > 0 for v in (inc[0], inc[1], inc[3]))
    assert [-v for v in comp if v is not None] == [v for v in inc if v is not None]
    assert inc[1] > 3 * inc[0]                     # 48x40 noise vs a flat colour
    assert 1.0 < inc[1] < 48 * 40 * 3 / 1000      # kB, below the raw RGB size


# ---------------------------------------------------------------- clip_score

def test_clip_score_matches_open_clip_cosine_and_scale():
    samples = image_samples()
    with_img = [s for s in samples if isinstance(s.output, Image.Image)]
    expected = manual_cos(*tiny_open_clip(seed=0), with_img)
    scores = clip.clip_score(**tiny_clip_kwargs(seed=0))(samples)
    assert scores[2] is None
    assert [scores[0], scores[1], scores[3]] == pytest.approx(expected, abs=1e-5)
    assert all(-1 <= v <= 1 for v in expected)
    scaled = clip.clip_score(**tiny_clip_kwargs(seed=0), scale=2.5, batch_size=1)(samples)
    assert [scaled[i] for i in (0, 1, 3)] == pytest.approx([2.5 * v for v in expected], abs=1e-5)


@pytest.mark.parametrize("kwargs, match", [({"dtype": "float8"}, "dtype"), ({"batch_size": 0}, "batch_size"),
                                           ({"model_config": {"embed_dim": 8}}, "model_config")])
def test_clip_score_bad_kwargs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        clip.clip_score(**{**tiny_clip_kwargs(), **kwargs})


def test_clip_score_unknown_model():
    with pytest.raises(ValueError, match="unknown open_clip model"):
        clip.clip_score(model="no-such-clip", pretrained=None)


# ---------------------------------------------------------------- pickscore

def test_pickscore_matches_manual_formula(tmp_path):
    from transformers import CLIPModel, CLIPProcessor

    folder = hf_clip_folder(tmp_path / "pick")
    samples = image_samples()
    scores = clip.pickscore(model=folder, processor=folder)(samples)
    raw = clip.pickscore(model=folder, processor=folder, scale_div=1.0)(samples)
    net, proc = CLIPModel.from_pretrained(folder).eval(), CLIPProcessor.from_pretrained(folder)
    expected = []
    for s in [samples[i] for i in (0, 1, 3)]:
        inputs = proc(text=[s.prompt], images=[s.output.convert("RGB")], return_tensors="pt", padding=True)
        with torch.no_grad():
            out = net(**inputs)
        expected.append((net.logit_scale.exp() * (out.image_embeds * out.text_embeds).sum()).item())
    assert scores[2] is None and raw[2] is None
    assert [raw[i] for i in (0, 1, 3)] == pytest.approx(expected, rel=1e-4)
    assert [scores[i] for i in (0, 1, 3)] == pytest.approx([v / 26 for v in expected], rel=1e-4)


def test_pickscore_bad_scale_div(tmp_path):
    with pytest.raises(ValueError, match="scale_div"):
        clip.pickscore(model=str(tmp_path), processor=str(tmp_path), scale_div=0)


# ---------------------------------------------------------------- hpsv2

def test_hpsv2_loads_checkpoint_and_scores_cosine(tmp_path):
    """HPS layout ({"state_dict": ...}); the contract test loads the plain "module." layout."""
    ckpt = hpsv2_checkpoint(tmp_path / "hps.pt", seed=0, wrap=True)
    samples = image_samples()
    expected = manual_cos(*tiny_open_clip(seed=0), [samples[i] for i in (0, 1, 3)])
    other_init = {**tiny_clip_kwargs(seed=1)}         # different random init: the checkpoint must replace it
    scores = clip.hpsv2(checkpoint=ckpt, **other_init)(samples)
    assert scores[2] is None
    assert [scores[i] for i in (0, 1, 3)] == pytest.approx(expected, abs=1e-5)


def test_hpsv2_needs_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="HPS"):
        clip.hpsv2(**tiny_clip_kwargs())
    with pytest.raises(ValueError, match="does not exist"):
        clip.hpsv2(checkpoint=str(tmp_path / "missing.pt"), **tiny_clip_kwargs())


# ---------------------------------------------------------------- aesthetic

@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_aesthetic_constant_mlp_gives_its_bias(tmp_path, suffix):
    ckpt = aesthetic_checkpoint(tmp_path / f"mlp{suffix}", bias=5.0)
    assert clip.aesthetic(checkpoint=ckpt, **tiny_clip_kwargs())(image_samples()) == [5.0, 5.0, None, 5.0]


def test_aesthetic_matches_mlp_on_normalised_embedding(tmp_path):
    ckpt = aesthetic_checkpoint(tmp_path / "mlp.pth", seed=3)
    samples = [image_samples()[i] for i in (0, 1, 3)]
    net, preprocess, _ = tiny_open_clip(seed=0)
    mlp = clip.aesthetic_mlp(32).eval()
    mlp.load_state_dict(torch.load(ckpt, weights_only=True))
    with torch.no_grad():
        emb = net.encode_image(torch.stack([preprocess(s.output.convert("RGB")) for s in samples]))
        expected = mlp["layers"](emb / emb.norm(dim=-1, keepdim=True)).squeeze(-1).tolist()
    scores = clip.aesthetic(checkpoint=ckpt, **tiny_clip_kwargs(seed=0))(samples)
    assert scores == pytest.approx(expected, abs=1e-5)
    assert len(set(round(v, 6) for v in scores)) == 3          # images are told apart


def test_aesthetic_checkpoint_errors(tmp_path):
    with pytest.raises(ValueError, match="checkpoint"):
        clip.aesthetic(**tiny_clip_kwargs())
    wrong = aesthetic_checkpoint(tmp_path / "mlp768.pth", embed_dim=768)
    with pytest.raises(ValueError, match=r"\[1024, 32\]"):
        clip.aesthetic(checkpoint=wrong, **tiny_clip_kwargs())
