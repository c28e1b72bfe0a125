"""The training loop by role: the `Generator` (`collect`: rollout, rewards, filters, advantages -> a `StepBatch`),
the `Learner` (`update`: epochs, optimizer, scheduler, EMA (`ema`), counters), the `Evaluator` (`evaluation`) and
the synchronous trainer that alternates them (`trainer`)."""
