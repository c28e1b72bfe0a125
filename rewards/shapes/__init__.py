"""The rewards of the shapes world (its generators, pretraining scripts and models live in
shapes_world/): the palette every part draws and checks with (palette.py) and the programmatic
verifiers `shapes_t2i` and `shapes_vlm` (verify.py) and `shapes_motion` / `shapes_motion_direction` for
clips (motion.py), registered by rewards.builtin."""
