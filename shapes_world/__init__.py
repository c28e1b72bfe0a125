"""The shapes world: procedural scenes of coloured circles, squares and triangles, the tasks posed on
them, and the tiny models pretrained on them that the CPU defaults start RL from (and the FrozenLake
agent's, pretrained on envs/frozenlake.py's lakes).

Generators (import no adapter; used as `data.train: shapes_world.<module>:<function>`):
  scene        seeded scenes and their rendering, in the one palette of rewards/shapes/palette.py
  tasks        VLM questions (`vlm_records`) and text-to-image prompts (`t2i_records`), fixed splits
  standins     PNG-record stand-ins for CLEVR-count and RefCOCO (`counting`, `grounding`)
Verifiers: rewards/shapes/verify.py (`shapes_vlm`, `shapes_t2i`), below the adapters as every reward.
Models (built from the adapters' tiny recipes, vlm/tiny.py and diffusion/tiny.py):
  vlm_model    the tiny Qwen2.5-VL of assets/tiny/shapes_vlm; pretrain_vlm trains it
  t2i_model    the tiny pixel-space SD3 of assets/tiny/shapes_t2i; pretrain_t2i trains it
  agent_model  the tiny Qwen2.5-VL of assets/tiny/frozenlake_agent; pretrain_agent trains it
"""
