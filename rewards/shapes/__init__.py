"""The shapes world: procedural scenes of coloured shapes, their VLM questions and
text-to-image prompts, and programmatic verifiers. Shared by both adapters' defaults."""
