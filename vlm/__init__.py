"""VLM reasoning adapter (`policy.name: vlm`): multimodal records, chat-template prompts, generation
backends (Hugging Face generate, vLLM) and token log-probs for image-text-to-text models.

Files, one job each: data/converters (records), images (decoding, resizing), prompts (chat template,
truncation), features (image encoder outputs, cached per prompt), batch (layout, image-token check),
generation (HF backend, blocked tokens), logprobs (the one scoring forward), model (loading, LoRA),
setup (building the parts), policy (the Policy protocol), tiny (offline test models; test data in shapes_world),
vllm_backend (optional). The user guide is docs/guides/vlm.md.
"""
