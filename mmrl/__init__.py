"""mmrl: reinforcement learning for multimodal models, one policy-gradient core.

The public types an adapter, a reward or a script needs are importable from here:

    from mmrl import Policy, PromptBatch, Rollout, Scores, Reference, BuildContext, Sample, Registry, load_object
"""

from mmrl.config.policies import BuildContext
from mmrl.registry import Registry, load_object
from mmrl.types import (
                        Evaluates,
                        Exports,
                        ForwardProcess,
                        HasExtraState,
                        HasReference,
                        Policy,
                        PromptBatch,
                        Reference,
                        Rollout,
                        Scores,
                        Shardable,
)
from rewards.sample import Sample

__all__ = ["BuildContext", "Evaluates", "Exports", "ForwardProcess", "HasExtraState", "HasReference", "Policy", "PromptBatch",
           "Reference", "Registry", "Rollout", "Sample", "Scores", "Shardable", "load_object"]
